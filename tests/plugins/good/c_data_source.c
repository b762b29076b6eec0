/* A data source written in plain C99 against dflash/abi.h alone: no LibTorch,
 * no C++. Batches cross as DLPack; the host wraps them without a copy. */
#include <dflash/abi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const dflash_host_api* host;
  int64_t rows, length, next, batches;
  char state[64];
} c_source;

typedef struct {
  dflash_dl_managed_tensor managed;
  int64_t shape[2];
  int64_t values[1]; /* rows * length follow */
} owned_block;

static void free_block(dflash_dl_managed_tensor* self) { free(self->manager_ctx); }

static dflash_error* make_tensor(c_source* s, int64_t first, int64_t step, dflash_tensor** out) {
  const int64_t n = s->rows * s->length;
  owned_block* block = (owned_block*)malloc(sizeof(owned_block) + (size_t)(n - 1) * sizeof(int64_t));
  int64_t i;
  if (block == NULL) return s->host->error_new(DFLASH_ERR_OUT_OF_MEMORY, "c_data: out of memory");
  memset(&block->managed, 0, sizeof(block->managed));
  for (i = 0; i < n; ++i) block->values[i] = first + step * i;
  block->shape[0] = s->rows;
  block->shape[1] = s->length;
  block->managed.version.major = 1;
  block->managed.manager_ctx = block;
  block->managed.deleter = free_block;
  block->managed.dl_tensor.data = block->values;
  block->managed.dl_tensor.device.device_type = 1; /* kDLCPU */
  block->managed.dl_tensor.ndim = 2;
  block->managed.dl_tensor.dtype.code = 0; /* kDLInt */
  block->managed.dl_tensor.dtype.bits = 64;
  block->managed.dl_tensor.dtype.lanes = 1;
  block->managed.dl_tensor.shape = block->shape;
  block->managed.dl_tensor.strides = NULL;
  return s->host->tensor_from_dlpack(&block->managed, out);
}

static dflash_error* next_batch(dflash_instance* self, dflash_tensor_map* batch, int32_t* end) {
  c_source* s = (c_source*)self;
  dflash_tensor* ids = NULL;
  dflash_tensor* mask = NULL;
  dflash_error* error;
  if (s->next >= s->batches) {
    *end = 1;
    return NULL;
  }
  *end = 0;
  error = make_tensor(s, s->next * 1000, 1, &ids);
  if (error) return error;
  error = s->host->map_set(batch, "input_ids", ids);
  if (error) return error;
  error = make_tensor(s, 1, 0, &mask);
  if (error) return error;
  error = s->host->map_set(batch, "loss_mask", mask);
  if (error) return error;
  s->next += 1;
  return NULL;
}

static dflash_error* save_state(dflash_instance* self, const char** out_json) {
  c_source* s = (c_source*)self;
  snprintf(s->state, sizeof(s->state), "{\"next\": %lld}", (long long)s->next);
  *out_json = s->state;
  return NULL;
}

static dflash_error* load_state(dflash_instance* self, const char* json) {
  c_source* s = (c_source*)self;
  long long next = 0;
  if (json == NULL || sscanf(json, "{\"next\": %lld}", &next) != 1 || next < 0)
    return s->host->error_new(DFLASH_ERR_DATA, "c_data: state is not {\"next\": N}");
  s->next = next;
  return NULL;
}

/* ABI 1.2: the batch shape for the memory planner, without an instance. */
static dflash_error* plan_memory(const dflash_host_api* host, const dflash_plan_request* request,
                                 dflash_memory_plan* plan) {
  dflash_error* error;
  (void)request;
  error = host->plan_add(plan, "c_data prefetch buffer", 0, DFLASH_MEMORY_RESIDENT);
  if (error) return error;
  return host->plan_set_facts(plan, "{\"rows\": 2, \"row_length\": 3}");
}

static const dflash_data_source_vtable table = {sizeof(dflash_data_source_vtable), next_batch, save_state, load_state,
                                                NULL /* describe (optional) */, plan_memory};

static dflash_error* create(const dflash_host_api* host, const dflash_create_args* args, dflash_instance** out) {
  c_source* s = (c_source*)calloc(1, sizeof(c_source));
  (void)args; /* the config has defaults only: {"rows": 2, "length": 3} is all it needs */
  if (s == NULL) return host->error_new(DFLASH_ERR_OUT_OF_MEMORY, "c_data: out of memory");
  s->host = host;
  s->rows = 2;
  s->length = 3;
  s->batches = 2;
  *out = (dflash_instance*)s;
  return NULL;
}

static void destroy(dflash_instance* self) { free(self); }

static const dflash_plugin_descriptor descriptor = {
    sizeof(dflash_plugin_descriptor), DFLASH_KIND_DATA_SOURCE, "c_data", "1.0.0", "a data source in C99 (DLPack)",
    "{\"type\": \"object\", \"properties\": {}}", create, destroy, &table};
static const dflash_plugin_descriptor* const descriptors[] = {&descriptor};
static const dflash_plugin_library library = {sizeof(dflash_plugin_library), DFLASH_ABI_MAJOR, DFLASH_ABI_MINOR,
                                              NULL, 1, descriptors};

DFLASH_EXPORT const dflash_plugin_library* dflash_plugin_entry_v1(void) { return &library; }
