/*
 * dflash/abi.h — the stable C ABI between dflash-host and its plugins.
 *
 * Pure C (C99). Nothing in this header depends on LibTorch, C++ or the host's
 * sources; a plugin that only deals in plain data (DLPack) can be written in C.
 *
 * Rules of evolution (see docs/abi-changelog.md):
 *   - DFLASH_ABI_MAJOR changes only on a break; the entry symbol carries it in
 *     its name (dflash_plugin_entry_v1), so a v2 library is never mistaken for
 *     a v1 one.
 *   - DFLASH_ABI_MINOR grows when fields or slots are appended. Fields are only
 *     ever appended at the end of a struct. Every struct that may grow starts
 *     with `size_t struct_size`, set by whoever allocates it to sizeof() of the
 *     struct as that side knows it. A reader never touches a field that lies
 *     beyond the struct_size it was given (use DFLASH_HAS_FIELD).
 *   - The host loads libraries whose major equals its own and whose minor is
 *     not newer than its own.
 *
 * Ownership conventions, written beside every pointer below:
 *   borrowed(X)  the callee may read it until X; it must not free it.
 *   new          the receiver owns it and must free it with the named function.
 *   static       lives as long as the library is loaded (the host never
 *                unloads a plugin library).
 *
 * Errors: every fallible call returns `dflash_error*`; NULL means success.
 * Errors are host-allocated objects created with dflash_host_api.error_new and
 * handed to the host by returning them; the host frees them. Nothing may
 * unwind (C++ exceptions) across this boundary.
 */
#ifndef DFLASH_ABI_H_
#define DFLASH_ABI_H_

#include <stddef.h>
#include <stdint.h>

#define DFLASH_ABI_MAJOR 1
#define DFLASH_ABI_MINOR 6

/* The one exported symbol of a plugin library. Its name carries the major. */
#define DFLASH_ENTRY_SYMBOL "dflash_plugin_entry_v1"
/* The loader probes DFLASH_ENTRY_SYMBOL_PREFIX "<n>" to explain a major mismatch. */
#define DFLASH_ENTRY_SYMBOL_PREFIX "dflash_plugin_entry_v"

#if defined(__GNUC__) || defined(__clang__)
#define DFLASH_EXPORT __attribute__((visibility("default")))
#else
#define DFLASH_EXPORT
#endif

/* Bytes of `type` up to and including `field`: the struct_size a struct had
 * in the version that introduced `field`. */
#define DFLASH_SIZE_THROUGH(type, field) \
  (offsetof(type, field) + sizeof(((type*)0)->field))
/* Whether a struct whose struct_size is `ptr->struct_size` contains `field`. */
#define DFLASH_HAS_FIELD(type, ptr, field) \
  ((ptr)->struct_size >= DFLASH_SIZE_THROUGH(type, field))

/* The target id of a row that nothing supervises: the drafter writes it into
 * "targets", the host passes it to the loss as dflash_loss_inputs.ignore_index
 * (PyTorch's convention). */
#define DFLASH_IGNORE_INDEX (-100)

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Kinds                                                                     */
/* ------------------------------------------------------------------------ */

/* Stored as int32_t in structs so the size never depends on the compiler. */
typedef enum dflash_kind {
  DFLASH_KIND_DATA_SOURCE = 1,
  DFLASH_KIND_TARGET_MODEL = 2,
  DFLASH_KIND_DRAFTER = 3,
  DFLASH_KIND_LOSS = 4,
  DFLASH_KIND_SCHEDULER = 5
} dflash_kind;

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum dflash_error_code {
  DFLASH_ERR_INVALID_ARGUMENT = 1, /* a tensor's shape/dtype/device is wrong */
  DFLASH_ERR_INVALID_CONFIG = 2,   /* a config value the schema could not catch */
  DFLASH_ERR_NOT_FOUND = 3,        /* a file, tensor or key does not exist */
  DFLASH_ERR_OUT_OF_MEMORY = 4,
  DFLASH_ERR_IO = 5,
  DFLASH_ERR_DATA = 6,             /* malformed input data */
  DFLASH_ERR_UNIMPLEMENTED = 7,
  DFLASH_ERR_INTERNAL = 8          /* a bug, or an exception of unknown type */
} dflash_error_code;

/* Opaque, host-allocated. Created by dflash_host_api.error_new. */
typedef struct dflash_error dflash_error;

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */
/* ------------------------------------------------------------------------ */

/* Opaque handle to one of the host's LibTorch tensors. Handles keep the
 * autograd graph: a loss computed from a drafter's output handle can be
 * back-propagated by the host. Every handle is host-allocated; the one who
 * owns a handle frees it with dflash_host_api.tensor_free. */
typedef struct dflash_tensor dflash_tensor;

/* Opaque, host-allocated map from names to tensor handles. The map owns the
 * handles put into it. */
typedef struct dflash_tensor_map dflash_tensor_map;

/* Plain data crosses as DLPack. The three structs below are layout-identical
 * to DLPack 1.x's DLDevice, DLDataType, DLTensor and DLManagedTensorVersioned
 * (kDLCPU = 1, kDLCUDA = 2; kDLInt = 0, kDLUInt = 1, kDLFloat = 2,
 * kDLBfloat = 4, kDLBool = 6); a pointer to one may be cast to the other. */
typedef struct dflash_dl_device {
  int32_t device_type;
  int32_t device_id;
} dflash_dl_device;

typedef struct dflash_dl_dtype {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} dflash_dl_dtype;

typedef struct dflash_dl_tensor {
  void* data;              /* borrowed(deleter call) */
  dflash_dl_device device;
  int32_t ndim;
  dflash_dl_dtype dtype;
  int64_t* shape;          /* borrowed(deleter call); ndim entries */
  int64_t* strides;        /* borrowed(deleter call); in elements; NULL = compact row-major */
  uint64_t byte_offset;
} dflash_dl_tensor;

#define DFLASH_DL_FLAG_READ_ONLY ((uint64_t)1)
#define DFLASH_DL_FLAG_IS_COPIED ((uint64_t)2)

typedef struct dflash_dl_managed_tensor {
  struct {
    uint32_t major; /* 1 */
    uint32_t minor;
  } version;
  void* manager_ctx; /* owned by the producer, for its deleter */
  /* Called exactly once by the consumer when it no longer needs the data.
   * (optional: NULL when nothing needs freeing) */
  void (*deleter)(struct dflash_dl_managed_tensor* self);
  uint64_t flags;
  dflash_dl_tensor dl_tensor;
} dflash_dl_managed_tensor;

/* ------------------------------------------------------------------------ */
/* Memory plans (ABI 1.2)                                                    */
/* ------------------------------------------------------------------------ */

/* When a planned allocation is alive during one training step on a device.
 * The host adds up each phase and takes the largest total as the peak:
 *   target forward:  RESIDENT + the batch + TARGET_FORWARD + the features so far
 *   drafter step:    RESIDENT + the features + ACTIVATIONS + the loss's share
 *                    + the larger of BACKWARD and the loss's working memory
 *   optimizer step:  RESIDENT + the optimizer's working memory
 * Stored as int32_t; new phases are only ever appended. */
typedef enum dflash_memory_phase {
  DFLASH_MEMORY_RESIDENT = 1,       /* held for the whole run: weights, caches */
  DFLASH_MEMORY_TARGET_FORWARD = 2, /* the target forward's working memory, freed when it returns */
  DFLASH_MEMORY_ACTIVATIONS = 3,    /* made by the drafter's forward, held until its backward passes them */
  DFLASH_MEMORY_BACKWARD = 4        /* the drafter backward's working memory at its peak, on top of ACTIVATIONS */
} dflash_memory_phase;

/* Opaque, host-owned: what a plan_memory call fills (host api plan_add and
 * plan_set_facts). */
typedef struct dflash_memory_plan dflash_memory_plan;

/* What a plan_memory call is asked about: an instance that does not exist
 * yet. Planning allocates nothing; the host plans before it creates. */
typedef struct dflash_plan_request {
  size_t struct_size;
  /* borrowed(the call): the plugin's config section as create would get it. */
  const char* config_json;
  const char* device; /* borrowed(the call): as dflash_create_args.device */
  const char* dtype;  /* borrowed(the call): as dflash_create_args.dtype */
  /* borrowed(the call): a JSON object of what the host already knows; its
   * keys are listed beside each kind's plan_memory slot. */
  const char* context_json;
} dflash_plan_request;

/* ------------------------------------------------------------------------ */
/* The host's function table, handed to every plugin instance at create      */
/* ------------------------------------------------------------------------ */

typedef enum dflash_log_level {
  DFLASH_LOG_TRACE = 0,
  DFLASH_LOG_DEBUG = 1,
  DFLASH_LOG_INFO = 2,
  DFLASH_LOG_WARN = 3,
  DFLASH_LOG_ERROR = 4
} dflash_log_level;

/* Which LibTorch a binary was compiled against. Recorded by the SDK in every
 * library that uses LibTorch's C++ API; the host refuses a library whose build
 * differs from its own, because LibTorch has no C++ ABI guarantee. */
typedef struct dflash_torch_build {
  size_t struct_size;
  const char* torch_version; /* static; TORCH_VERSION, e.g. "2.11.0" */
  const char* cuda_version;  /* static; e.g. "13.0", or "none" for a CPU-only LibTorch */
  int32_t cxx11_abi;         /* _GLIBCXX_USE_CXX11_ABI (0 or 1); -1 if not libstdc++ */
} dflash_torch_build;

typedef struct dflash_host_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const dflash_torch_build* torch_build; /* static: the host's own LibTorch */

  /* --- errors --- */
  /* new: message is copied. The result is normally returned to the host,
   * which then owns it. Never returns NULL. */
  dflash_error* (*error_new)(int32_t code, const char* message);
  int32_t (*error_code)(const dflash_error* error);
  /* borrowed(error_free of that error) */
  const char* (*error_message)(const dflash_error* error);
  /* Frees an error the plugin got from the host and does not pass on. */
  void (*error_free)(dflash_error* error);

  /* --- logging (the host's spdlog sink; prefixed with the plugin's name) --- */
  void (*log)(int32_t level, const char* plugin_name, const char* message);

  /* --- tensor handles --- */
  void (*tensor_free)(dflash_tensor* tensor); /* NULL is a no-op */
  /* new: a second handle to the same tensor (same storage, same grad graph). */
  dflash_tensor* (*tensor_share)(const dflash_tensor* tensor);
  /* new handle in *out on success. Takes ownership of `source` whatever the
   * result: its deleter runs when the tensor is freed, or at once on error.
   * The tensor aliases the DLPack memory (no copy). */
  dflash_error* (*tensor_from_dlpack)(dflash_dl_managed_tensor* source,
                                      dflash_tensor** out);
  /* new in *out: the caller calls (*out)->deleter(*out) exactly once.
   * Refused for a tensor that requires grad (DLPack has no autograd). */
  dflash_error* (*tensor_to_dlpack)(const dflash_tensor* tensor,
                                    dflash_dl_managed_tensor** out);
  /* LibTorch bridge, for libraries whose dflash_torch_build matched the
   * host's (the SDK uses it; C plugins never need it).
   * borrowed(tensor_free of `tensor`): a `const at::Tensor*`. */
  const void* (*tensor_torch_ref)(const dflash_tensor* tensor);
  /* new: a handle holding a new reference to `*(const at::Tensor*)at_tensor`. */
  dflash_tensor* (*tensor_from_torch)(const void* at_tensor);

  /* --- tensor maps --- */
  /* Stores `tensor` under `name` (copied), replacing any earlier entry.
   * Takes ownership of `tensor` whatever the result. */
  dflash_error* (*map_set)(dflash_tensor_map* map, const char* name,
                           dflash_tensor* tensor);
  /* borrowed(the map's destruction or the next map_set of that name);
   * NULL when absent. */
  const dflash_tensor* (*map_get)(const dflash_tensor_map* map, const char* name);
  size_t (*map_size)(const dflash_tensor_map* map);
  /* borrowed(as map_get). Entries are in insertion order. */
  const char* (*map_name_at)(const dflash_tensor_map* map, size_t index);
  const dflash_tensor* (*map_tensor_at)(const dflash_tensor_map* map, size_t index);

  /* --- memory plans (ABI 1.2) --- */
  /* Adds `bytes` of device memory to the plan in `phase` (dflash_memory_phase)
   * under `category` (copied): a short label a person reads in the plan's
   * table, e.g. "layer activations: MLP". */
  dflash_error* (*plan_add)(dflash_memory_plan* plan, const char* category, uint64_t bytes, int32_t phase);
  /* Merges the keys of a JSON object (copied) into the plan's facts. */
  dflash_error* (*plan_set_facts)(dflash_memory_plan* plan, const char* facts_json);
} dflash_host_api;

/* (optional, ABI 1.2) The memory an instance created with `request` would use
 * on its device, per phase, without creating it: no device memory may be
 * allocated. Fills `plan` through host->plan_add / plan_set_facts. */
typedef dflash_error* (*dflash_plan_memory_fn)(const dflash_host_api* host, const dflash_plan_request* request,
                                               dflash_memory_plan* plan);

/* ------------------------------------------------------------------------ */
/* Instances                                                                 */
/* ------------------------------------------------------------------------ */

/* Opaque, plugin-owned: whatever the plugin allocates in create. */
typedef struct dflash_instance dflash_instance;

typedef struct dflash_create_args {
  size_t struct_size;
  /* borrowed(the call): the plugin's own config section as a JSON object,
   * validated by the host against the plugin's schema, defaults filled in. */
  const char* config_json;
  /* borrowed(the call): where the instance's tensors live ("cpu", "cuda:0").
   * The host decides placement; a plugin never moves tensors elsewhere. */
  const char* device;
  /* borrowed(the call): compute dtype ("float32", "bfloat16", "float16"). */
  const char* dtype;
  uint64_t seed; /* for every random choice the instance makes */
} dflash_create_args;

/* ------------------------------------------------------------------------ */
/* Threads and CUDA streams (stated in ABI 1.5; hosts of 1.0–1.4 already     */
/* kept to it)                                                               */
/* ------------------------------------------------------------------------ */
/* - One instance's calls never overlap: the host calls an instance from one
 *   thread at a time. A data source's next_batch and save_state may run on
 *   a worker thread of the host (train.prefetch), still one call at a time
 *   and in the order a single thread would make them; every other instance
 *   is called from the thread that created it.
 * - Different instances may be called at the same time from different
 *   threads (a data source's fetch beside a target's forward), so anything
 *   a library shares between its instances (statics, caches, a pool of
 *   streams) must be safe to use from two threads.
 * - The host API's functions may be called from the thread the host called
 *   the plugin on, during that call, and from no other thread.
 * - CUDA: the host passes no stream. A plugin orders its device work on the
 *   current CUDA stream of the device its tensors are on, as LibTorch's
 *   getCurrentCUDAStream gives it when the call begins. Input tensors are
 *   ready for work queued on that stream; output tensors must be ready for
 *   work the host queues on it after the call returns. Work a plugin puts
 *   on streams of its own must be joined to that stream (an event wait)
 *   before the call returns. The host does not synchronize the device
 *   around calls, and a plugin need not either; it waits only where it
 *   needs a value on the host itself.
 * - Sessions (decode_*, draft_*) belong to their instance and follow the
 *   same rules. */

/* ------------------------------------------------------------------------ */
/* Per-kind function tables. Slots marked (optional) may be NULL; every     */
/* other slot is required and the loader refuses a library that leaves one  */
/* NULL. Unless said otherwise, input pointers are borrowed(the call).       */
/* ------------------------------------------------------------------------ */

/* --- data source -------------------------------------------------------- */
/* A batch is a tensor map. Names (all on the CPU, row-major):
 *   "input_ids"    [B, S] int64
 *   "loss_mask"    [B, S] uint8 or int64, 1 where the token is supervised
 *   "position_ids" [B, S] int64 (optional) restarting at each packed document
 *   "document_ids" [B, S] int64 (optional) which packed document a token is in
 * Plugins may add more; consumers ignore names they do not know. */
typedef struct dflash_data_source_vtable {
  size_t struct_size;
  /* Fills `batch` (host-owned, empty). At the end of the data it leaves the
   * map empty and sets *end_of_data = 1; otherwise sets it to 0. */
  dflash_error* (*next_batch)(dflash_instance* self, dflash_tensor_map* batch,
                              int32_t* end_of_data);
  /* *out_json: borrowed(the next call on self): the position as JSON. */
  dflash_error* (*save_state)(dflash_instance* self, const char** out_json);
  /* Restores a position saved by save_state (possibly by another process). */
  dflash_error* (*load_state)(dflash_instance* self, const char* state_json);
  /* (optional) *out_json: borrowed(destroy): facts about the data, e.g.
   * {"vocab_size": 151936, "sequences": 1200}. */
  dflash_error* (*describe)(dflash_instance* self, const char** out_json);
  /* (optional, ABI 1.2) Context: {}. Facts: "rows" and "row_length", the
   * largest batch it yields ([rows, row_length]); and, where a config key's
   * value is rounded, "effective": {key: value}. Batches live on the CPU, so
   * most sources add no items. */
  dflash_plan_memory_fn plan_memory;
} dflash_data_source_vtable;

/* --- target model ------------------------------------------------------- */
/* One step of incremental decoding (ABI 1.1): tokens appended to a decoding
 * session, and what the caller wants back for them. */
typedef struct dflash_target_decode_request {
  size_t struct_size;
  const dflash_tensor* tokens; /* borrowed(the call): [n] int64, n ≥ 1 */
  const int64_t* layer_ids;    /* borrowed(the call); layer_count entries */
  size_t layer_count;
  int32_t want_logits;         /* nonzero: add "logits" [n, V] */
} dflash_target_decode_request;

/* Which logits a batched decoding step returns (ABI 1.3). Stored as int32_t;
 * new values are only ever appended. */
typedef enum dflash_decode_logits {
  DFLASH_DECODE_LOGITS_NONE = 0, /* no "logits" */
  DFLASH_DECODE_LOGITS_ALL = 1,  /* "logits" [count, n, V]: after every appended token */
  DFLASH_DECODE_LOGITS_LAST = 2  /* "logits" [count, 1, V]: after each session's last appended token */
} dflash_decode_logits;

/* One step of incremental decoding over several sessions at once (ABI 1.3):
 * row i of `tokens` is appended to sessions[i]. Every session gets the same
 * number n of tokens (1 while generating; more to verify a drafted block). */
typedef struct dflash_target_batch_decode_request {
  size_t struct_size;
  const int64_t* sessions;     /* borrowed(the call): count ids, each at most once */
  size_t count;                /* ≥ 1 */
  const dflash_tensor* tokens; /* borrowed(the call): [count, n] int64, n ≥ 1 (CPU or the model's device) */
  const int64_t* layer_ids;    /* borrowed(the call); layer_count entries */
  size_t layer_count;
  int32_t logits;              /* dflash_decode_logits */
} dflash_target_batch_decode_request;

/* A draft tree verified in one pass (ABI 1.4; speculative decoding with a
 * tree of drafts, DDTree). Node i holds tokens[i]; its parent is node
 * parents[i] (−1 ≤ parents[i] < i; −1: the session's last cached token).
 * A node of depth d (1 for a child of the last cached token) sits at
 * position length + d − 1 and attends to the session's cache, its
 * ancestors and itself: nothing else of the tree. */
typedef struct dflash_target_tree_request {
  size_t struct_size;
  const dflash_tensor* tokens; /* borrowed(the call): [n] int64, n ≥ 1 (CPU or the model's device) */
  const int64_t* parents;      /* borrowed(the call): n entries */
  size_t count;                /* n */
  const int64_t* layer_ids;    /* borrowed(the call); layer_count entries */
  size_t layer_count;
  int32_t want_logits;         /* nonzero: add "logits" [n, V] */
} dflash_target_tree_request;

typedef struct dflash_target_request {
  size_t struct_size;
  /* borrowed(the call): a batch as a data source yields it, on the model's device. */
  const dflash_tensor_map* batch;
  const int64_t* layer_ids; /* borrowed(the call); layer_count entries */
  size_t layer_count;
  int32_t want_last_hidden; /* nonzero: add "last_hidden" (after the final norm) */
  int32_t want_logits;      /* nonzero: add "logits" [B, S, V] */
} dflash_target_request;

typedef struct dflash_target_vtable {
  size_t struct_size;
  /* *out_json: borrowed(destroy). At least {"num_layers", "hidden_size",
   * "vocab_size", "default_layer_ids": [...]}; more keys may follow. */
  dflash_error* (*describe)(dflash_instance* self, const char** out_json);
  /* Inference only: no autograd graph. Fills `out` with "hidden.<id>"
   * [B, S, H] for every requested layer id, plus what the flags ask for. */
  dflash_error* (*forward)(dflash_instance* self, const dflash_target_request* request,
                           dflash_tensor_map* out);
  /* Fills `out` with the frozen verifier weights: "embed_tokens" [V, H],
   * "lm_head" [V, H], "final_norm" [H]. The host copies them explicitly to
   * each drafter device; the handles must not require grad. */
  dflash_error* (*frozen_weights)(dflash_instance* self, dflash_tensor_map* out);

  /* ABI 1.1 — incremental decoding, (optional) as a group: all four or none.
   * A session is one sequence and its KV cache, named by a plugin-chosen id.
   * Opens an empty session that holds up to max_length tokens. */
  dflash_error* (*decode_begin)(dflash_instance* self, int64_t max_length, int64_t* out_session);
  /* Appends request->tokens at positions [length, length + n), each attending
   * causally to everything before it, and fills `out` with "hidden.<id>"
   * [n, H] for every requested layer and "logits" [n, V] if asked. Fails,
   * leaving the session as it was, when it would exceed max_length. */
  dflash_error* (*decode_extend)(dflash_instance* self, int64_t session,
                                 const dflash_target_decode_request* request, dflash_tensor_map* out);
  /* Keeps the first `length` tokens (drops rejected draft tokens). */
  dflash_error* (*decode_truncate)(dflash_instance* self, int64_t session, int64_t length);
  /* Frees the session; unknown ids are ignored. */
  void (*decode_end)(dflash_instance* self, int64_t session);

  /* (optional, ABI 1.2) Context: {"rows", "row_length"} (the batch). Facts:
   * what describe would return (at least num_layers, hidden_size,
   * vocab_size, default_layer_ids) plus "weights_dtype" and
   * "tied_embeddings" (bool), and (optional) "forward_streams": how many
   * CUDA streams besides the caller's its forward runs GEMMs on (the host
   * counts a cuBLAS workspace for each; absent: 0). Items: its weights (RESIDENT) and its
   * forward's working memory (TARGET_FORWARD); not the hidden states it
   * returns, which the host counts. */
  dflash_plan_memory_fn plan_memory;

  /* (optional, ABI 1.3; only beside the decoding group) One pass over many
   * sessions: appends request->tokens row i to request->sessions[i], each
   * token at its own session's next position and attending causally to that
   * session's cache alone. Fills `out` with "hidden.<id>" [count, n, H] for
   * every requested layer and "logits" as request->logits asks, row i for
   * sessions[i]; each row equals what decode_extend would give that session
   * alone, up to rounding. Fails, leaving every session as it was, when a
   * session is unknown or repeated, or one would exceed its max_length. The
   * host calls decode_extend per session when a target leaves it NULL. */
  dflash_error* (*decode_extend_batch)(dflash_instance* self, const dflash_target_batch_decode_request* request,
                                       dflash_tensor_map* out);

  /* ABI 1.4 — tree verification, (optional) both or neither, only beside the
   * decoding group. decode_verify_tree appends a tree to the session
   * provisionally and fills `out` with "hidden.<id>" [n, H] for every
   * requested layer and "logits" [n, V] if asked: node i's rows equal what
   * decode_extend would give for its path (ancestors, then itself), up to
   * rounding. Fails, leaving the session as it was, when a parent is out of
   * range or the deepest node would exceed max_length. Until
   * decode_accept_path the session takes no other call but decode_end. */
  dflash_error* (*decode_verify_tree)(dflash_instance* self, int64_t session, const dflash_target_tree_request* request,
                                      dflash_tensor_map* out);
  /* Keeps, of the tree just verified, the nodes path[0..count) — path[0] a
   * child of the last cached token (parent −1), each next node a child of
   * the one before; count 0 keeps none — and drops the rest: the session
   * then holds what decode_extend of those tokens would have left. Fails,
   * leaving the tree pending, when `path` is not such a chain. */
  dflash_error* (*decode_accept_path)(dflash_instance* self, int64_t session, const int64_t* path, size_t count);
} dflash_target_vtable;

/* --- drafter ------------------------------------------------------------ */
typedef struct dflash_drafter_vtable {
  size_t struct_size;
  /* Fills `out` with the trainable parameters under stable names (the
   * checkpoint's tensor names). Handles alias the live leaf tensors: the
   * host's optimizer updates them in place. */
  dflash_error* (*parameters)(dflash_instance* self, dflash_tensor_map* out);
  /* Hands the drafter the target's description (JSON, as target describe
   * returns it) and frozen weights, already on the drafter's device. The
   * drafter may keep handles (tensor_share) for its lifetime. */
  dflash_error* (*bind_target)(dflash_instance* self, const char* target_json,
                               const dflash_tensor_map* frozen_weights);
  /* Training forward. `inputs`: the batch plus the target's "hidden.<id>"
   * tensors. Fills `out` with what a loss consumes:
   *   "hidden"      [N, H] after the final norm (carries the grad graph)
   *   "targets"     [N] int64, DFLASH_IGNORE_INDEX (-100) where nothing is supervised
   *   "row_weights" [N] float
   *   "slot"        [N] int64, the row's place in a decoding step's chain,
   *                 1 … block_size − 1 (DFlash: its position in the block;
   *                 EAGLE-3: its training-time-test step + 1); the host
   *                 tallies per-slot accuracy and simulated τ by it
   * and optionally "teacher_hidden" [N, H]. */
  dflash_error* (*forward)(dflash_instance* self, const dflash_tensor_map* inputs,
                           dflash_tensor_map* out);
  /* Required from ABI 1.5 (the loader refuses a 1.5 drafter that leaves it
   * NULL); optional in 1.0–1.4, where the host then refused the drafter at
   * train or eval. *out_json: borrowed(the next call on self): the fields a
   * checkpoint's config.json needs. The host reads two facts from it and
   * trains or evaluates no drafter that lacks them: "block_size" (integer
   * ≥ 1) and "target_layer_ids" (the target layers it reads, in order).
   * (1.5 also required "mask_token_id"; from 1.6 it is the drafter's own
   * key, compared by eval only where checkpoint_match names it.) */
  dflash_error* (*export_config)(dflash_instance* self, const char** out_json);
  /* (optional) Switches dropout and the like; training is the default. */
  dflash_error* (*set_training)(dflash_instance* self, int32_t training);

  /* ABI 1.1 — speculative decoding, (optional) as a group: all four or none.
   * A drafting session follows one sequence's accepted tokens. */
  dflash_error* (*draft_begin)(dflash_instance* self, int64_t* out_session);
  /* Appends accepted tokens to the session's context: `inputs` holds
   * "input_ids" [n] int64 and, for every id in the drafter's
   * target_layer_ids (export_config), the target's "hidden.<id>" [n, H] at
   * those tokens' positions. */
  dflash_error* (*draft_extend)(dflash_instance* self, int64_t session, const dflash_tensor_map* inputs);
  /* Proposes up to `count` tokens to follow the context and `inputs`'
   * "last_token" [1] int64 (the newest token, whose target features are not
   * known yet). Fills `out` with "tokens" [m] int64, 0 ≤ m ≤ count. */
  dflash_error* (*draft_propose)(dflash_instance* self, int64_t session, const dflash_tensor_map* inputs,
                                 int64_t count, dflash_tensor_map* out);
  /* Frees the session; unknown ids are ignored. */
  void (*draft_end)(dflash_instance* self, int64_t session);

  /* (optional, ABI 1.2) Context: {"target": the target's facts, "rows",
   * "row_length", "teacher" (bool: "last_hidden" is among its inputs)}.
   * Facts: "parameters" (trainable elements, created in the request's
   * dtype), "target_layer_ids", "loss_rows" (the most rows its forward hands
   * the loss), "hidden_size" (of those rows); with loss_heads (ABI 1.6)
   * also "loss_vocab" (its head's rows, V_d), "loss_weight_trainable" (bool)
   * and "teacher_hidden" (H_t of its teacher head, 0 or absent: none), so
   * the loss is sized over its vocabulary and the teacher head counted;
   * without them, the target's vocabulary and frozen head. Items: whatever it holds beyond
   * its parameters and the host's frozen weights (RESIDENT), its forward's
   * tensors saved for backward (ACTIVATIONS; its outputs included) and its
   * backward's working memory (BACKWARD). The host counts parameters,
   * gradients, optimizer states and the frozen weights itself. */
  dflash_plan_memory_fn plan_memory;

  /* (optional, ABI 1.4; only beside the drafting group) As draft_propose,
   * but the drafter's best k tokens at each of up to `count` positions,
   * for a tree of drafts: fills `out` with "tokens" [m, k] int64 and
   * "log_probs" [m, k] float32 (its log-softmax's k largest, best first;
   * 0 ≤ m ≤ count). k ≥ 1 is at most the vocabulary. */
  dflash_error* (*draft_propose_topk)(dflash_instance* self, int64_t session, const dflash_tensor_map* inputs,
                                      int64_t count, int64_t k, dflash_tensor_map* out);

  /* (optional, ABI 1.5) *out_json: borrowed(the next call on self): which
   * keys of a saved checkpoint's config.json must agree before its weights
   * are loaded into this instance (eval, and anything else that loads a
   * drafter checkpoint): {"drafter": [key, …], compared with this instance's
   * export_config, and "target": {key: fact, …}, each config.json key
   * compared with that fact of the target's describe}. A key absent on
   * either side is not compared. NULL: the host compares only the two
   * facts above (block_size, target_layer_ids). */
  dflash_error* (*checkpoint_match)(dflash_instance* self, const char** out_json);

  /* (optional, ABI 1.6) The heads the loss uses, for a drafter whose output
   * vocabulary is not the target's (a draft vocabulary). Fills `out` with
   * "lm_head" [V_d, H]: its own trainable head, the same leaf as in
   * parameters (the optimizer updates it); and, for a teacher through hidden
   * states, "teacher_lm_head" [V_d, H_t]: frozen, the target's head
   * restricted to the draft vocabulary, row i the target token of draft id i.
   * Its forward then writes "targets" in draft ids (DFLASH_IGNORE_INDEX where
   * the token is outside the draft vocabulary). Called once, after
   * bind_target; handles alias live tensors. NULL: the target's lm_head
   * serves student and teacher. */
  dflash_error* (*loss_heads)(dflash_instance* self, dflash_tensor_map* out);
  /* (optional, ABI 1.6) Persistent tensors that are not trained (a draft
   * vocabulary's maps, say), under stable names distinct from the
   * parameters'. Handles alias the live tensors: the host saves them in the
   * checkpoint beside the parameters and, on resume and eval, copies the
   * saved ones into them in place (same names, shapes and dtypes). They
   * never reach the optimizer, gradient clipping or the gradient reducer. */
  dflash_error* (*buffers)(dflash_instance* self, dflash_tensor_map* out);
} dflash_drafter_vtable;

/* --- loss --------------------------------------------------------------- */
typedef enum dflash_teacher_kind {
  DFLASH_TEACHER_NONE = 0,   /* hard labels only */
  DFLASH_TEACHER_HIDDEN = 1, /* teacher hidden states through the same lm_head */
  DFLASH_TEACHER_TOPK = 2    /* teacher top-K ids and log-probs */
} dflash_teacher_kind;

typedef struct dflash_loss_inputs {
  size_t struct_size;
  const dflash_tensor* hidden;         /* [N, H] student hidden states (grad) */
  const dflash_tensor* lm_head_weight; /* [V, H], frozen or trainable */
  const dflash_tensor* targets;        /* [N] int64 */
  int64_t ignore_index;                /* rows whose target equals it add nothing */
  const dflash_tensor* row_weights;    /* (optional) [N] float; NULL = all 1 */
  int32_t teacher_kind;                /* dflash_teacher_kind */
  const dflash_tensor* teacher_hidden;        /* [N, H] when teacher_kind == HIDDEN */
  const dflash_tensor* teacher_topk_ids;      /* [N, K] int64 when TOPK */
  const dflash_tensor* teacher_topk_logprobs; /* [N, K] float when TOPK */
  /* (optional, ABI 1.6) [V, H_t] when teacher_kind == HIDDEN: the teacher's
   * logits are teacher_hidden [N, H_t] · this weightᵀ instead of through
   * lm_head_weight. A drafter with a head of its own over a draft vocabulary
   * gives the target's head restricted to the same V tokens here. NULL: the
   * teacher shares lm_head_weight. The host hands it only to a loss library
   * of ABI 1.6 or later (an older one would not read it). */
  const dflash_tensor* teacher_lm_head_weight;
} dflash_loss_inputs;

typedef struct dflash_loss_outputs {
  size_t struct_size;
  /* out, new: a 0-dim tensor whose graph reaches `hidden` (and the weight
   * when it requires grad). */
  dflash_tensor* loss;
  /* borrowed(the call), host-owned, empty on entry: named metrics, each a
   * 0-dim tensor or an [N] per-row tensor (e.g. "accuracy" per row so the host
   * can aggregate per slot). Metrics carry no grad. */
  dflash_tensor_map* metrics;
} dflash_loss_outputs;

typedef struct dflash_loss_shape {
  size_t struct_size;
  int64_t rows;   /* N */
  int64_t hidden; /* H */
  int64_t vocab;  /* V */
  int64_t topk;   /* K when teacher_kind == TOPK, else 0 */
  int32_t teacher_kind;
  int32_t element_bytes;     /* of hidden / weight, e.g. 2 for bf16 */
  int32_t weight_trainable;  /* nonzero if the lm_head weight takes grad */
  /* (ABI 1.6) nonzero when the teacher's logits come through a weight of
   * their own (dflash_loss_inputs.teacher_lm_head_weight) of hidden size
   * teacher_hidden. */
  int32_t separate_teacher_weight;
  int64_t teacher_hidden; /* H_t */
} dflash_loss_shape;

typedef struct dflash_memory_estimate {
  size_t struct_size;
  /* Bytes the call adds at its peak, beyond its inputs, in forward + backward. */
  uint64_t peak_bytes;
  /* Of those, bytes kept alive between forward and backward. */
  uint64_t saved_for_backward_bytes;
} dflash_memory_estimate;

typedef struct dflash_loss_vtable {
  size_t struct_size;
  dflash_error* (*compute)(dflash_instance* self, const dflash_loss_inputs* inputs,
                           dflash_loss_outputs* outputs);
  /* (optional) How much memory compute + backward will need at `shape`;
   * `out` is host-allocated with struct_size set. */
  dflash_error* (*estimate_memory)(dflash_instance* self, const dflash_loss_shape* shape,
                                   dflash_memory_estimate* out);
} dflash_loss_vtable;

/* --- LR scheduler ------------------------------------------------------- */
typedef struct dflash_schedule_point {
  size_t struct_size;
  int64_t step;        /* 0-based optimizer step */
  int64_t total_steps; /* planned optimizer steps of the run */
  double base_lr;      /* the optimizer's configured peak lr */
} dflash_schedule_point;

typedef struct dflash_scheduler_vtable {
  size_t struct_size;
  /* Pure function of the point (and the config): same input, same lr. */
  dflash_error* (*lr_at)(dflash_instance* self, const dflash_schedule_point* point,
                         double* out_lr);
  /* (optional) For schedulers with state beyond the step (e.g. on plateau).
   * *out_json: borrowed(the next call on self). */
  dflash_error* (*save_state)(dflash_instance* self, const char** out_json);
  /* (optional, required if save_state is set) */
  dflash_error* (*load_state)(dflash_instance* self, const char* state_json);
} dflash_scheduler_vtable;

/* ------------------------------------------------------------------------ */
/* Descriptors and the entry point                                           */
/* ------------------------------------------------------------------------ */

typedef struct dflash_plugin_descriptor {
  size_t struct_size;
  int32_t kind;            /* dflash_kind */
  const char* name;        /* static; [a-z0-9_]+, unique per kind */
  const char* version;     /* static; the plugin's own version, e.g. "1.2.0" */
  const char* description; /* static; one line */
  /* static: the plugin's configuration as a JSON Schema subset (object with
   * "properties"; each with "type", "default", "description", and optional
   * "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum",
   * "items", "minItems", "maxItems", "properties", "required").
   * See docs/config.md. */
  const char* config_schema_json;
  /* new in *out_instance on success; freed with destroy. `host` is
   * static (lives as long as the process). */
  dflash_error* (*create)(const dflash_host_api* host, const dflash_create_args* args,
                          dflash_instance** out_instance);
  void (*destroy)(dflash_instance* self); /* NULL is a no-op */
  /* static: the kind's table (dflash_loss_vtable* for DFLASH_KIND_LOSS, ...). */
  const void* vtable;
} dflash_plugin_descriptor;

typedef struct dflash_plugin_library {
  size_t struct_size;
  uint32_t abi_major; /* DFLASH_ABI_MAJOR the library was built with */
  uint32_t abi_minor; /* DFLASH_ABI_MINOR the library was built with */
  /* static; NULL if the library does not use LibTorch's C++ API (it then
   * deals in DLPack only and loads into any host). */
  const dflash_torch_build* torch_build;
  size_t plugin_count;
  const dflash_plugin_descriptor* const* plugins; /* static; plugin_count entries */
} dflash_plugin_library;

/* The entry point. Side-effect free: it returns static data and may be called
 * any number of times. Exported as DFLASH_ENTRY_SYMBOL. */
typedef const dflash_plugin_library* (*dflash_plugin_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DFLASH_ABI_H_ */
