/* One small C plugin, compiled once per defect (-DDEFECT_<NAME>), so each
 * loader failure mode has a real shared object to be tested against. Without
 * a DEFECT_ define it is a valid loss plugin named by PLUGIN_NAME. */
#include <dflash/abi.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "broken"
#endif

static dflash_error* compute(dflash_instance* self, const dflash_loss_inputs* in, dflash_loss_outputs* out) {
  (void)self;
  (void)in;
  (void)out;
  return NULL;
}

static const dflash_loss_vtable loss_table = {
    sizeof(dflash_loss_vtable),
#ifdef DEFECT_MISSING_SLOT
    NULL, /* compute is required */
#else
    compute,
#endif
    NULL, /* estimate_memory (optional) */
};

#if defined(DEFECT_PARTIAL_DECODE) || defined(DEFECT_BATCH_WITHOUT_DECODE) || defined(DEFECT_HALF_TREE) || \
    defined(DEFECT_TREE_WITHOUT_DECODE)
#define BROKEN_TARGET 1
#endif
#if defined(DEFECT_TOPK_WITHOUT_DRAFT) || defined(DEFECT_NO_EXPORT_CONFIG) || defined(DEFECT_NO_EXPORT_CONFIG_1_4)
#define BROKEN_DRAFTER 1
#endif

#ifdef BROKEN_TARGET
/* DEFECT_PARTIAL_DECODE: a target model that fills only one slot of the
 * optional decoding group. DEFECT_BATCH_WITHOUT_DECODE: one that sets ABI
 * 1.3's decode_extend_batch but not the group whose sessions it steps.
 * DEFECT_HALF_TREE: ABI 1.4's decode_verify_tree without decode_accept_path.
 * DEFECT_TREE_WITHOUT_DECODE: both tree slots, no decoding group. */
static dflash_error* t_describe(dflash_instance* self, const char** out_json) {
  (void)self;
  *out_json = "{}";
  return NULL;
}
static dflash_error* t_forward(dflash_instance* self, const dflash_target_request* r, dflash_tensor_map* out) {
  (void)self, (void)r, (void)out;
  return NULL;
}
static dflash_error* t_frozen(dflash_instance* self, dflash_tensor_map* out) {
  (void)self, (void)out;
  return NULL;
}
#if defined(DEFECT_PARTIAL_DECODE)
static dflash_error* t_decode_begin(dflash_instance* self, int64_t max_length, int64_t* out_session) {
  (void)self, (void)max_length;
  *out_session = 1;
  return NULL;
}
#elif defined(DEFECT_BATCH_WITHOUT_DECODE)
static dflash_error* t_decode_extend_batch(dflash_instance* self, const dflash_target_batch_decode_request* r,
                                           dflash_tensor_map* out) {
  (void)self, (void)r, (void)out;
  return NULL;
}
#else
static dflash_error* t_verify_tree(dflash_instance* self, int64_t session, const dflash_target_tree_request* r,
                                   dflash_tensor_map* out) {
  (void)self, (void)session, (void)r, (void)out;
  return NULL;
}
#ifdef DEFECT_TREE_WITHOUT_DECODE
static dflash_error* t_accept_path(dflash_instance* self, int64_t session, const int64_t* path, size_t count) {
  (void)self, (void)session, (void)path, (void)count;
  return NULL;
}
#endif
#endif
static const dflash_target_vtable target_table = {
    sizeof(dflash_target_vtable), t_describe, t_forward, t_frozen,
#if defined(DEFECT_PARTIAL_DECODE)
    t_decode_begin, NULL, NULL, NULL, NULL /* plan_memory (optional) */, NULL, NULL, NULL,
#elif defined(DEFECT_BATCH_WITHOUT_DECODE)
    NULL, NULL, NULL, NULL, NULL /* plan_memory (optional) */, t_decode_extend_batch, NULL, NULL,
#elif defined(DEFECT_HALF_TREE)
    NULL, NULL, NULL, NULL, NULL /* plan_memory (optional) */, NULL, t_verify_tree, NULL,
#else
    NULL, NULL, NULL, NULL, NULL /* plan_memory (optional) */, NULL, t_verify_tree, t_accept_path,
#endif
};
#endif

#ifdef BROKEN_DRAFTER
/* DEFECT_TOPK_WITHOUT_DRAFT: a drafter that sets ABI 1.4's
 * draft_propose_topk but not the drafting group whose sessions it reads.
 * DEFECT_NO_EXPORT_CONFIG: one of this ABI without export_config (required
 * since 1.5); DEFECT_NO_EXPORT_CONFIG_1_4: the same, built as for ABI 1.4,
 * when it was optional (it loads). */
#if !defined(DEFECT_NO_EXPORT_CONFIG) && !defined(DEFECT_NO_EXPORT_CONFIG_1_4)
static dflash_error* d_export_config(dflash_instance* self, const char** out_json) {
  (void)self;
  *out_json = "{\"block_size\": 4, \"target_layer_ids\": [0], \"mask_token_id\": null}";
  return NULL;
}
#endif
static dflash_error* d_parameters(dflash_instance* self, dflash_tensor_map* out) {
  (void)self, (void)out;
  return NULL;
}
static dflash_error* d_bind_target(dflash_instance* self, const char* json, const dflash_tensor_map* frozen) {
  (void)self, (void)json, (void)frozen;
  return NULL;
}
static dflash_error* d_forward(dflash_instance* self, const dflash_tensor_map* inputs, dflash_tensor_map* out) {
  (void)self, (void)inputs, (void)out;
  return NULL;
}
#ifdef DEFECT_TOPK_WITHOUT_DRAFT
static dflash_error* d_propose_topk(dflash_instance* self, int64_t session, const dflash_tensor_map* inputs, int64_t count,
                                    int64_t k, dflash_tensor_map* out) {
  (void)self, (void)session, (void)inputs, (void)count, (void)k, (void)out;
  return NULL;
}
#endif
static const dflash_drafter_vtable drafter_table = {
    sizeof(dflash_drafter_vtable), d_parameters, d_bind_target, d_forward,
#if defined(DEFECT_NO_EXPORT_CONFIG) || defined(DEFECT_NO_EXPORT_CONFIG_1_4)
    NULL,
#else
    d_export_config,
#endif
    NULL, NULL, NULL, NULL, NULL, NULL /* plan_memory (optional) */,
#ifdef DEFECT_TOPK_WITHOUT_DRAFT
    d_propose_topk,
#else
    NULL,
#endif
    NULL /* checkpoint_match (optional) */,
};
#endif

static int instance_token;

#if defined(DEFECT_CRASH_IN_CREATE) || defined(DEFECT_CRASH_IN_ENTRY)
/* A real invalid write. The address is read through a volatile so the
 * compiler cannot see a NULL dereference and replace it with a trap. */
static volatile uintptr_t bad_address = 8;
static void segfault(void) { *(volatile int*)bad_address = 1; }
#endif

#ifdef DEFECT_ABORT_AT_LOAD
/* A static initialiser that fails: runs inside dlopen, before any entry. */
__attribute__((constructor)) static void abort_at_load(void) { abort(); }
#endif

static dflash_error* create(const dflash_host_api* host, const dflash_create_args* args, dflash_instance** out) {
  (void)args;
#ifdef DEFECT_CREATE_ERROR
  (void)out;
  return host->error_new(DFLASH_ERR_INVALID_CONFIG, "the weights file '/nonexistent/w.bin' does not exist");
#else
#ifdef DEFECT_CRASH_IN_CREATE
  segfault();
#endif
  (void)host;
  *out = (dflash_instance*)&instance_token;
  return NULL;
#endif
}

static void destroy(dflash_instance* self) { (void)self; }

static const dflash_plugin_descriptor descriptor = {
#ifdef DEFECT_SMALL_STRUCT
    8,
#else
    sizeof(dflash_plugin_descriptor),
#endif
#ifdef DEFECT_UNKNOWN_KIND
    42,
#elif defined(BROKEN_TARGET)
    DFLASH_KIND_TARGET_MODEL,
#elif defined(BROKEN_DRAFTER)
    DFLASH_KIND_DRAFTER,
#else
    DFLASH_KIND_LOSS,
#endif
    PLUGIN_NAME,
    "0.1.0",
    "a test plugin",
#ifdef DEFECT_BAD_SCHEMA
    "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\", \"default\": \"seven\"}}}",
#else
    "{\"type\": \"object\", \"properties\": {}}",
#endif
    create,
    destroy,
#if defined(BROKEN_TARGET)
    &target_table,
#elif defined(BROKEN_DRAFTER)
    &drafter_table,
#else
    &loss_table,
#endif
};

static const dflash_plugin_descriptor* const descriptors[] = {&descriptor};

#ifdef DEFECT_TORCH_MISMATCH
static const dflash_torch_build other_torch = {sizeof(dflash_torch_build), "0.4.1", "9.2", 0};
#endif

static const dflash_plugin_library library = {
    sizeof(dflash_plugin_library),
#ifdef DEFECT_MAJOR_FIELD
    7,
#else
    DFLASH_ABI_MAJOR,
#endif
#ifdef DEFECT_NEWER_MINOR
    DFLASH_ABI_MINOR + 5,
#elif defined(DEFECT_NO_EXPORT_CONFIG_1_4)
    4,
#else
    DFLASH_ABI_MINOR,
#endif
#ifdef DEFECT_TORCH_MISMATCH
    &other_torch,
#else
    NULL, /* deals in DLPack only */
#endif
    1,
    descriptors,
};

#if defined(DEFECT_NO_ENTRY)
DFLASH_EXPORT int some_other_function(void) { return 1; }
#elif defined(DEFECT_ABI_MAJOR)
/* What a library built for a future ABI 2 exports instead. */
DFLASH_EXPORT const dflash_plugin_library* dflash_plugin_entry_v2(void) { return &library; }
#elif defined(DEFECT_CRASH_IN_ENTRY)
DFLASH_EXPORT const dflash_plugin_library* dflash_plugin_entry_v1(void) {
  segfault();
  return &library;
}
#else
DFLASH_EXPORT const dflash_plugin_library* dflash_plugin_entry_v1(void) { return &library; }
#endif
