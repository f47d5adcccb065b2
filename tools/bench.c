/*
 * bench.c: `smla bench`, and the helpers every subcommand of the tool shares (random data,
 * device memory, argument parsing, filling a cache through smla_cache_write).
 *
 * What `smla bench` measures: smla_forward at DeepSeek-V3.2 shapes (Dqk 576, Dv 512,
 * K 2048) over a KV pool of --slots rows (262144 bf16 rows = 302 MB, five times the 60 MB
 * L2 of an H100/H200), with fresh random slots per query row, distinct within a row, and
 * random non-zero bf16 data. Napkin math per forward:
 *   FLOPs    = 2 * T * N * K * (Dqk + Dv)        (QK^T and PV; exp and scaling not counted)
 *   gathered = T * K * row_bytes                 (each row's K cache rows, read once per row)
 * A decode step (T = 1..64) is bandwidth-bound on a GPU: 2*N*1088 FLOP per gathered row of
 * 1152 B is 30 FLOP/B at N = 16 and 242 at N = 128, against a ridge of about 200 FLOP/B.
 */
#include "bench.h"

#include "numerics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ======================================================================================
 * Random numbers and slot rows
 * ==================================================================================== */
void tool_rng_seed(tool_rng *r, uint64_t seed) { r->state = seed ^ 0x5DEECE66D2545F49ull; }

uint64_t tool_rng_next(tool_rng *r) {
  uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Modulo bias is below 2^-40 for the n (< 2^24) the tool uses. */
uint64_t tool_rng_below(tool_rng *r, uint64_t n) { return tool_rng_next(r) % n; }

float tool_rng_nonzero(tool_rng *r, float amp) {
  const uint64_t u = tool_rng_next(r);
  const double frac = (double)(u >> 11) * 0x1p-53;
  const float mag = amp * (float)(1.0 / 64.0 + (63.0 / 64.0) * frac);
  return (u & 1u) ? -mag : mag;
}

void tool_fill_bf16(tool_rng *r, uint16_t *dst, size_t n, float amp) {
  for (size_t i = 0; i < n; i++) dst[i] = smla_f32_to_bf16(tool_rng_nonzero(r, amp));
}

int tool_sampler_init(tool_sampler *s, int64_t num_slots) {
  s->num_slots = num_slots;
  s->perm = malloc((size_t)num_slots * sizeof *s->perm);
  if (!s->perm) return -1;
  for (int64_t i = 0; i < num_slots; i++) s->perm[i] = (int32_t)i;
  return 0;
}

void tool_sampler_free(tool_sampler *s) {
  free(s->perm);
  s->perm = NULL;
}

void tool_sampler_draw(tool_sampler *s, tool_rng *r, int32_t *dst, int k) {
  /* The first k steps of Fisher-Yates; the array stays a permutation, so the next draw
   * may start from it as it is. */
  for (int i = 0; i < k; i++) {
    const int64_t j = i + (int64_t)tool_rng_below(r, (uint64_t)(s->num_slots - i));
    const int32_t t = s->perm[i];
    s->perm[i] = s->perm[j];
    s->perm[j] = t;
    dst[i] = s->perm[i];
  }
}

/* ======================================================================================
 * Device memory
 * ==================================================================================== */
#define TOOL_ALIGN 256 /* the plan workspace rule; also covers every 16-byte rule */

void tool_report(const tool_device *d, const char *what, smla_status s) {
  fprintf(stderr, "smla: %s: %s: %s\n", what, smla_status_string(s),
          smla_context_message(d ? d->ctx : NULL));
}

int tool_device_open(tool_device *d, int device) {
  memset(d, 0, sizeof *d);
  d->device = device;
  smla_status s = smla_context_create(&d->ctx, device);
  if (s != SMLA_OK) {
    /* The context does not exist, so the message comes from the static NULL-ctx one;
     * the status alone already says why (no CUDA in the build, no such device). */
    if (device == SMLA_DEVICE_CPU)
      fprintf(stderr, "smla: cannot create a CPU context: %s\n", smla_status_string(s));
    else
      fprintf(stderr, "smla: cannot use CUDA device %d: %s (%d CUDA devices visible)\n",
              device, smla_status_string(s), smla_cuda_device_count());
    return -1;
  }
#ifdef SMLA_HAVE_CUDA
  if (device >= 0) {
    if (tool_cuda_set_device(device) || tool_cuda_stream_create(&d->stream)) {
      smla_context_destroy(d->ctx);
      d->ctx = NULL;
      return -1;
    }
  }
#endif
  return 0;
}

void tool_device_close(tool_device *d) {
#ifdef SMLA_HAVE_CUDA
  if (d->stream) tool_cuda_stream_destroy(d->stream);
#endif
  smla_context_destroy(d->ctx);
  memset(d, 0, sizeof *d);
}

void *tool_alloc(const tool_device *d, size_t bytes) {
  const size_t rounded = (bytes + TOOL_ALIGN - 1) / TOOL_ALIGN * TOOL_ALIGN;
  void *p = NULL;
  if (d->device == SMLA_DEVICE_CPU) {
    p = aligned_alloc(TOOL_ALIGN, rounded ? rounded : TOOL_ALIGN);
    if (!p) fprintf(stderr, "smla: out of host memory (%zu bytes)\n", bytes);
    return p;
  }
#ifdef SMLA_HAVE_CUDA
  if (tool_cuda_malloc(&p, rounded ? rounded : TOOL_ALIGN)) return NULL;
#endif
  return p;
}

void tool_free(const tool_device *d, void *p) {
  if (!p) return;
  if (d->device == SMLA_DEVICE_CPU) {
    free(p);
    return;
  }
#ifdef SMLA_HAVE_CUDA
  tool_cuda_free(p);
#endif
}

static int tool_copy(const tool_device *d, void *dst, const void *src, size_t bytes, int dir) {
  if (d->device == SMLA_DEVICE_CPU) {
    memmove(dst, src, bytes);
    return 0;
  }
#ifdef SMLA_HAVE_CUDA
  return tool_cuda_copy(d->stream, dst, src, bytes, dir);
#else
  (void)dir;
  return -1;
#endif
}

int tool_upload(const tool_device *d, void *dst, const void *src, size_t bytes) {
  return tool_copy(d, dst, src, bytes, 0);
}

int tool_download(const tool_device *d, void *dst, const void *src, size_t bytes) {
  return tool_copy(d, dst, src, bytes, 1);
}

int tool_memset(const tool_device *d, void *dst, int byte, size_t bytes) {
  if (d->device == SMLA_DEVICE_CPU) {
    memset(dst, byte, bytes);
    return 0;
  }
#ifdef SMLA_HAVE_CUDA
  return tool_cuda_memset(d->stream, dst, byte, bytes);
#else
  return -1;
#endif
}

int tool_sync(const tool_device *d) {
#ifdef SMLA_HAVE_CUDA
  if (d->device >= 0) return tool_cuda_sync(d->stream);
#endif
  (void)d;
  return 0;
}

int tool_write_rows(const tool_device *d, const smla_cache *cache, const uint16_t *kv_c,
                    const uint16_t *k_pe, const int64_t *slot, int64_t num_rows) {
  const int dr = cache->dr;
  const size_t kv_bytes = (size_t)num_rows * SMLA_DC * 2, pe_bytes = (size_t)num_rows * dr * 2;
  const size_t slot_bytes = (size_t)num_rows * sizeof *slot;
  void *d_kv = tool_alloc(d, kv_bytes), *d_pe = dr ? tool_alloc(d, pe_bytes) : NULL;
  void *d_slot = tool_alloc(d, slot_bytes), *d_bad = tool_alloc(d, sizeof(uint64_t));
  int rc = -1;
  if (!d_kv || (dr && !d_pe) || !d_slot || !d_bad) goto done;
  if (tool_upload(d, d_kv, kv_c, kv_bytes) || (dr && tool_upload(d, d_pe, k_pe, pe_bytes)) ||
      tool_upload(d, d_slot, slot, slot_bytes) || tool_memset(d, d_bad, 0, sizeof(uint64_t)))
    goto done;
  smla_cache_write_params w = {0};
  w.num_tokens = num_rows;
  w.kv_c = d_kv;
  w.kv_c_stride = SMLA_DC;
  w.k_pe = d_pe;
  w.k_pe_stride = dr;
  w.slot = d_slot;
  w.cache = *cache;
  w.bad_inputs = d_bad;
  smla_status s = smla_cache_write(d->ctx, &w, d->stream);
  if (s != SMLA_OK) {
    tool_report(d, "smla_cache_write", s);
    goto done;
  }
  uint64_t bad = 0;
  if (tool_sync(d) || tool_download(d, &bad, d_bad, sizeof bad)) goto done;
  if (bad) {
    fprintf(stderr, "smla: smla_cache_write counted %llu bad rows (expected 0)\n",
            (unsigned long long)bad);
    goto done;
  }
  rc = 0;
done:
  tool_free(d, d_kv);
  tool_free(d, d_pe);
  tool_free(d, d_slot);
  tool_free(d, d_bad);
  return rc;
}

int tool_plan(const tool_device *d, int64_t max_tokens, int heads, int topk, int dr,
              smla_cache_format format, int num_splits, int heads_per_block, uint32_t flags,
              smla_plan **plan) {
  smla_plan_desc pd = {0};
  pd.num_splits = num_splits;
  pd.heads_per_block = heads_per_block;
  pd.flags = flags;
  pd.max_tokens = max_tokens;
  pd.num_heads = heads;
  pd.topk = topk;
  pd.dr = dr;
  pd.format = format;
  const smla_status s = smla_plan_create(d->ctx, &pd, NULL, 0, plan);
  if (s != SMLA_OK) {
    tool_report(d, "smla_plan_create", s);
    return -1;
  }
  return 0;
}

void tool_forward_params(smla_forward_params *p, int64_t tokens, int heads, int topk,
                         const smla_cache *cache, const void *q, const int32_t *slots,
                         void *out, float *lse, uint64_t *bad_inputs) {
  const int dqk = SMLA_DC + cache->dr;
  memset(p, 0, sizeof *p);
  p->num_tokens = tokens;
  p->num_heads = heads;
  p->topk = topk;
  p->q_nope = q;
  p->q_nope_stride_t = (int64_t)heads * dqk;
  p->q_nope_stride_h = dqk;
  p->q_pe = cache->dr ? (const char *)q + SMLA_DC * 2 : NULL;
  p->q_pe_stride_t = (int64_t)heads * dqk;
  p->q_pe_stride_h = dqk;
  p->cache = *cache;
  p->slots = slots;
  p->slots_stride = topk;
  p->sm_scale = (float)(1.0 / sqrt((double)dqk));
  p->out = out;
  p->out_stride_t = (int64_t)heads * SMLA_DC;
  p->out_stride_h = SMLA_DC;
  p->lse = lse;
  p->lse_stride_t = heads;
  p->bad_inputs = bad_inputs;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double tool_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ======================================================================================
 * Argument parsing
 * ==================================================================================== */
int tool_parse_int(const char *s, long long lo, long long hi, long long *v) {
  if (!s || !*s) return -1;
  char *end = NULL;
  errno = 0;
  const long long x = strtoll(s, &end, 10);
  if (errno || *end || x < lo || x > hi) return -1;
  *v = x;
  return 0;
}

int tool_parse_list(const char *s, long long lo, long long hi, int64_t *out, int max) {
  int n = 0;
  const char *p = s;
  while (p && *p) {
    char item[32];
    const char *comma = strchr(p, ',');
    const size_t len = comma ? (size_t)(comma - p) : strlen(p);
    long long v;
    if (len == 0 || len >= sizeof item || n >= max) return -1;
    memcpy(item, p, len);
    item[len] = 0;
    if (tool_parse_int(item, lo, hi, &v)) return -1;
    out[n++] = v;
    p = comma ? comma + 1 : NULL;
    if (comma && !*p) return -1; /* trailing comma */
  }
  return n ? n : -1;
}

int tool_parse_device(const char *s, int *device) {
  long long v;
  if (s && strcmp(s, "cpu") == 0) {
    *device = SMLA_DEVICE_CPU;
    return 0;
  }
  if (tool_parse_int(s, 0, 1023, &v)) return -1;
  *device = (int)v;
  return 0;
}

static const struct {
  const char *name;
  smla_cache_format format;
} tool_formats[] = {
    {"bf16", SMLA_CACHE_BF16},
    {"fp8_tensor", SMLA_CACHE_FP8_TENSOR},
    {"fp8_ds", SMLA_CACHE_FP8_DS},
};

int tool_parse_format(const char *s, smla_cache_format *f) {
  for (size_t i = 0; s && i < sizeof tool_formats / sizeof tool_formats[0]; i++)
    if (strcmp(s, tool_formats[i].name) == 0) {
      *f = tool_formats[i].format;
      return 0;
    }
  return -1;
}

const char *tool_format_name(smla_cache_format f) {
  for (size_t i = 0; i < sizeof tool_formats / sizeof tool_formats[0]; i++)
    if (tool_formats[i].format == f) return tool_formats[i].name;
  return "?";
}

double tool_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ======================================================================================
 * smla bench
 * ==================================================================================== */
#define BENCH_MAX_LIST 32
#define BENCH_DQK(dr) (SMLA_DC + (dr))
#define BENCH_DV SMLA_DC
/* Rows written per smla_cache_write call while filling the pool (9 MB of bf16 staging). */
#define BENCH_FILL_CHUNK 8192
/* Each shape rotates among input sets (q and slots) whose gathered rows add up to at
 * least 4 x the 60 MB L2 of an H200, so that repeated forwards do not find their rows in
 * L2 (a decode forward at T = 1 gathers only 2.4 MB). */
#define BENCH_ROTATE_BYTES (240.0 * 1e6)
#define BENCH_MAX_SETS 128
#define BENCH_MAX_SET_BYTES (4.0 * 1e9) /* cap on all sets' q + slots together */
/* GPU: forwards with T <= this are timed as CUDA-graph replays (launch overhead would
 * dominate a 10 us kernel timed alone); each graph holds >= this many forwards. */
#define BENCH_GRAPH_MAX_T 64
#define BENCH_GRAPH_MIN_FORWARDS 20
#define BENCH_GPU_REPS 30
#define BENCH_GPU_WARMUP 3
/* Cold timing (--timing cold|both), the method of the peer figures in the issues: one
 * forward per graph replay, 256 MiB zeroed before each replay, median of 50. */
#define BENCH_COLD_FLUSH_BYTES ((size_t)256 << 20)
#define BENCH_COLD_REPS 50

enum { TIMING_AMORTIZED = 1, TIMING_COLD = 2 }; /* bits of bench_opts.timing */
/* CPU: 2 * T * N * K * 1088 FLOP at 25-35 GFLOP/s per core takes up to ~0.1 s per call at
 * T = 64, N = 16 and ~0.5 s at N = 128 (2 cores), so the CPU takes fewer samples: as many
 * as fit in about a second per shape, between 3 and 10, unless --reps says otherwise.
 * The whole default decode bench then takes ~10 s on 2 cores. */
#define BENCH_CPU_BUDGET_S 1.0
#define BENCH_CPU_MIN_REPS 3
#define BENCH_CPU_MAX_REPS 10
#define BENCH_CPU_WARMUP 1

static const int64_t bench_decode_tokens[] = {1, 2, 4, 8, 16, 32, 64};
static const int64_t bench_prefill_tokens[] = {256, 512, 1024, 2048, 4096};
/* --paths: the shapes of the decode path choice (T = 1..512 at N = 8, 16, 64, 128), and the
 * forced split counts tried beside the plan's own choice. */
static const int64_t bench_paths_tokens[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
static const int64_t bench_paths_heads[] = {8, 16, 64, 128};
static const int bench_paths_splits[] = {1, 2, 4, 8, 16, 32};
#define BENCH_MAX_VARIANTS 64

typedef struct bench_opts {
  const char *preset; /* "decode" or "prefill" */
  int device;
  int64_t heads[BENCH_MAX_LIST];
  int num_heads;
  int64_t tokens[BENCH_MAX_LIST];
  int num_tokens;
  int topk, dr, threads, use_graph;
  int splits, portable, separate; /* --splits (0: the plan picks), --portable,
                                     --separate-merge */
  int hb;                          /* --heads-per-block (0: the plan picks) */
  int paths;                       /* --paths: every path of each shape, and the plan's */
  int indices_bs, two_call;        /* --indices BS: request-local positions through a block
                                      table (smla_forward_indices; --two-call: convert, then
                                      forward) */
  smla_cache_format format;
  int64_t slots;
  int reps; /* 0: the device's default */
  int timing; /* TIMING_* bits; the GPU default is both, the CPU's amortized */
  uint64_t seed;
  const char *json;
} bench_opts;

typedef struct bench_row {
  int64_t tokens;
  int heads;
  char path[SMLA_DESCRIBE_MAX];
  int reps, graph, per_graph, sets;
  double median_us, min_us;   /* amortized timing (0: not run) */
  double cold_us, cold_min_us; /* cold timing (0: not run) */
  double rate_us;              /* the time behind the rate columns: amortized if run */
  double flops, bytes;         /* per forward */
  double flop_per_s, bytes_per_s;
  double pct_flops, pct_bw, pct_roof; /* < 0: no ceilings (CPU) */
  uint64_t bad_inputs;
} bench_row;

typedef struct bench_meta {
  char device_name[256];
  char date[64];
  char commit[64];
  const char *command;
  size_t row_bytes;
  double copy_bytes_per_s, gemm_flop_per_s; /* 0: not measured */
  void *flush;                              /* GPU, cold timing: the buffer zeroed */
  char timing[512];
} bench_meta;

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: smla bench [--preset decode|prefill] [--device cpu|N] [-N list] [-T list]\n"
          "                  [-K 2048] [--dr 0|64] [--format bf16|fp8_tensor|fp8_ds]\n"
          "                  [--slots 262144] [--reps R] [--seed S] [--threads N]\n"
          "                  [--no-graph] [--splits S] [--heads-per-block H] [--portable]\n"
          "                  [--separate-merge]\n"
          "                  [--timing amortized|cold|both] [--paths] [--indices BS]\n"
          "                  [--two-call] [--json FILE]\n"
          "  Times smla_forward at DeepSeek-V3.2 shapes over a random KV pool of --slots\n"
          "  rows. Presets: decode T = 1,2,4,8,16,32,64; prefill T = 256,...,4096.\n"
          "  Defaults: GPU 0 if there is one, else the CPU; N = 16,128; reps %d on a GPU,\n"
          "  %d..%d on the CPU (as many as fit in about %.0f s per shape).\n"
          "  Lists are comma-separated (-N 16,128 -T 1,64). --splits forces the KV split\n"
          "  count (desc.num_splits), --heads-per-block a block's head group (8, 16, 32 or\n"
          "  64: desc.heads_per_block); --portable asks for SMLA_PLAN_PORTABLE (on H100/H200:\n"
          "  the generic mma.sync kernel instead of the wgmma one); --separate-merge asks\n"
          "  for SMLA_PLAN_SEPARATE_MERGE (splits merged by the combine kernel only).\n"
          "  --timing (GPU; default both): amortized = many forwards on rotating inputs per\n"
          "  graph replay (T <= %d) or per event pair; cold = one forward per graph replay,\n"
          "  %zu MiB zeroed before each (L2 flushed), median of %d. The rate columns use\n"
          "  the amortized time when it was taken.\n"
          "  --paths: for each shape, the plan's own choice and every other path (forced\n"
          "  splits 1..32, in-kernel or separate merge, the generic kernel; at T <= 32 also\n"
          "  narrower head groups of 8, 16, 32, up to 8 groups), one line per\n"
          "  shape with the chosen path's time against the fastest (every row in --json);\n"
          "  default T = 1..512, N = 8,16,64,128.\n"
          "  --indices BS: each row its own request, whose K positions (distinct, random in\n"
          "  a context of 2K) go through a block table of BS-slot blocks drawn from the pool:\n"
          "  times smla_forward_indices (conversion inside the forward), or with --two-call\n"
          "  smla_convert_indices then smla_forward (one more launch and the slots' trip).\n",
          BENCH_GPU_REPS, BENCH_CPU_MIN_REPS, BENCH_CPU_MAX_REPS, BENCH_CPU_BUDGET_S,
          BENCH_GRAPH_MAX_T, BENCH_COLD_FLUSH_BYTES >> 20, BENCH_COLD_REPS);
}

static void cpu_model_name(char *buf, size_t bytes) {
  snprintf(buf, bytes, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      const char *colon = strchr(line, ':');
      if (colon) {
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        snprintf(buf, bytes, "%s", colon);
        buf[strcspn(buf, "\n")] = 0;
      }
      break;
    }
  }
  fclose(f);
}

/* The commit: $SMLA_GIT_COMMIT, else `git rev-parse --short HEAD`, else "unknown". */
static void git_commit(char *buf, size_t bytes) {
  const char *env = getenv("SMLA_GIT_COMMIT");
  snprintf(buf, bytes, "unknown");
  if (env && *env) {
    snprintf(buf, bytes, "%s", env);
    return;
  }
  FILE *p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
  if (!p) return;
  char line[64] = {0};
  const int got = fgets(line, sizeof line, p) != NULL;
  if (pclose(p) == 0 && got) {
    line[strcspn(line, "\r\n")] = 0;
    if (line[0]) snprintf(buf, bytes, "%s", line);
  }
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    const unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* A number, or null where it is not a finite value (JSON has no NaN). */
static void json_number(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.10g", v);
  else fputs("null", f);
}

static int bench_write_json(const char *path, const bench_opts *o, const bench_meta *m,
                            const bench_row *rows, int num_rows) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "smla: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  const int gpu = o->device >= 0;
  fprintf(f, "{\n  \"tool\": \"smla bench\",\n  \"meta\": {\n    \"smla_version\": ");
  json_string(f, smla_version_string());
  fprintf(f, ",\n    \"build_features\": ");
  json_string(f, smla_build_features());
  if (gpu) fprintf(f, ",\n    \"device\": %d", o->device);
  else fprintf(f, ",\n    \"device\": \"cpu\"");
  fprintf(f, ",\n    \"device_name\": ");
  json_string(f, m->device_name);
  fprintf(f, ",\n    \"date\": ");
  json_string(f, m->date);
  fprintf(f, ",\n    \"git_commit\": ");
  json_string(f, m->commit);
  fprintf(f, ",\n    \"command\": ");
  json_string(f, m->command);
  fprintf(f, ",\n    \"preset\": ");
  json_string(f, o->preset);
  fprintf(f, ",\n    \"format\": ");
  json_string(f, tool_format_name(o->format));
  fprintf(f,
          ",\n    \"dr\": %d,\n    \"dqk\": %d,\n    \"dv\": %d,\n    \"topk\": %d,"
          "\n    \"slots\": %lld,\n    \"row_bytes\": %zu,\n    \"pool_bytes\": %.0f,"
          "\n    \"seed\": %llu,\n    \"timing\": ",
          o->dr, BENCH_DQK(o->dr), BENCH_DV, o->topk, (long long)o->slots, m->row_bytes,
          (double)m->row_bytes * (double)o->slots, (unsigned long long)o->seed);
  json_string(f, m->timing);
  fprintf(f, ",\n    \"flops_formula\": \"2*T*N*K*(Dqk+Dv)\","
             "\n    \"bytes_formula\": \"T*K*row_bytes (gathered cache rows)\"");
  if (gpu && m->copy_bytes_per_s > 0) {
    fprintf(f, ",\n    \"ceilings\": {\"copy_bytes_per_s\": ");
    json_number(f, m->copy_bytes_per_s);
    fprintf(f, ", \"gemm_flop_per_s\": ");
    json_number(f, m->gemm_flop_per_s);
    fprintf(f, ", \"copy\": \"cudaMemcpyAsync device to device, 1 GiB, read+written\", "
               "\"gemm\": \"cublasGemmEx 8192^3 bf16 in, fp32 accumulate\"}");
  } else {
    fprintf(f, ",\n    \"ceilings\": null");
  }
  fprintf(f, "\n  },\n  \"rows\": [");
  for (int i = 0; i < num_rows; i++) {
    const bench_row *r = &rows[i];
    fprintf(f, "%s\n    {\"T\": %lld, \"N\": %d, \"K\": %d, \"path\": ", i ? "," : "",
            (long long)r->tokens, r->heads, o->topk);
    json_string(f, r->path);
    fprintf(f, ", \"median_us\": ");
    json_number(f, r->median_us > 0 ? r->median_us : NAN);
    fprintf(f, ", \"min_us\": ");
    json_number(f, r->min_us > 0 ? r->min_us : NAN);
    fprintf(f, ", \"cold_us\": ");
    json_number(f, r->cold_us > 0 ? r->cold_us : NAN);
    fprintf(f, ", \"cold_min_us\": ");
    json_number(f, r->cold_min_us > 0 ? r->cold_min_us : NAN);
    fprintf(f, ", \"cold_reps\": %d", r->cold_us > 0 ? BENCH_COLD_REPS : 0);
    fprintf(f, ", \"reps\": %d, \"graph\": %s, \"forwards_per_sample\": %d, \"input_sets\": %d",
            r->reps, r->graph ? "true" : "false", r->per_graph, r->sets);
    fprintf(f, ", \"flops\": ");
    json_number(f, r->flops);
    fprintf(f, ", \"bytes\": ");
    json_number(f, r->bytes);
    fprintf(f, ", \"tflop_s\": ");
    json_number(f, r->flop_per_s * 1e-12);
    fprintf(f, ", \"tb_s\": ");
    json_number(f, r->bytes_per_s * 1e-12);
    fprintf(f, ", \"pct_flops\": ");
    json_number(f, r->pct_flops >= 0 ? r->pct_flops : NAN);
    fprintf(f, ", \"pct_bw\": ");
    json_number(f, r->pct_bw >= 0 ? r->pct_bw : NAN);
    fprintf(f, ", \"pct_roofline\": ");
    json_number(f, r->pct_roof >= 0 ? r->pct_roof : NAN);
    fprintf(f, ", \"bad_inputs\": %llu}", (unsigned long long)r->bad_inputs);
  }
  fprintf(f, "\n  ]\n}\n");
  if (fclose(f)) {
    fprintf(stderr, "smla: error writing %s\n", path);
    return -1;
  }
  return 0;
}

/* One shape's device buffers and the forward that every timed call starts from. */
typedef struct bench_shape {
  smla_plan *plan;
  smla_forward_params base;
  int sets;
  char *q;           /* [sets][T][N][Dqk] bf16 */
  int32_t *slots;    /* [sets][T][K] */
  size_t q_set_bytes, slots_set_elems;
  int dr;
  /* --indices: slots above hold request-local positions; conv describes the rest (req_id,
   * block table; slots: the two-call path's converted slots) */
  int indices, two_call;
  smla_convert_params conv;
  smla_context *ctx;
} bench_shape;

static int bench_launch(void *arg, int index, void *stream) {
  const bench_shape *b = arg;
  smla_forward_params p = b->base;
  const int set = index % b->sets;
  p.q_nope = b->q + (size_t)set * b->q_set_bytes;
  p.q_pe = b->dr ? (const char *)p.q_nope + (size_t)SMLA_DC * 2 : NULL;
  p.slots = b->slots + (size_t)set * b->slots_set_elems;
  if (!b->indices) return (int)smla_forward(b->plan, &p, stream);
  smla_convert_params c = b->conv;
  c.local = p.slots;
  if (!b->two_call) {
    p.slots = NULL;
    return (int)smla_forward_indices(b->plan, &p, &c, stream);
  }
  const smla_status s = smla_convert_indices(b->ctx, &c, stream);
  if (s != SMLA_OK) return (int)s;
  p.slots = c.slots;
  return (int)smla_forward(b->plan, &p, stream);
}

/* Fills every slot of the pool with random rows, through the library's own writer. */
static int bench_fill_pool(const tool_device *d, const smla_cache *cache, tool_rng *rng) {
  const int dr = cache->dr;
  uint16_t *kv = malloc((size_t)BENCH_FILL_CHUNK * SMLA_DC * 2);
  uint16_t *pe = malloc((size_t)BENCH_FILL_CHUNK * (dr ? dr : 1) * 2);
  int64_t *slot = malloc((size_t)BENCH_FILL_CHUNK * sizeof *slot);
  int rc = -1;
  if (!kv || !pe || !slot) {
    fprintf(stderr, "smla: out of host memory\n");
    goto done;
  }
  for (int64_t base = 0; base < cache->num_slots; base += BENCH_FILL_CHUNK) {
    int64_t n = cache->num_slots - base;
    if (n > BENCH_FILL_CHUNK) n = BENCH_FILL_CHUNK;
    tool_fill_bf16(rng, kv, (size_t)n * SMLA_DC, 1.0f);
    tool_fill_bf16(rng, pe, (size_t)n * dr, 1.0f);
    for (int64_t i = 0; i < n; i++) slot[i] = base + i;
    if (tool_write_rows(d, cache, kv, dr ? pe : NULL, slot, n)) goto done;
  }
  rc = 0;
done:
  free(kv);
  free(pe);
  free(slot);
  return rc;
}

/* Times one (T, N) shape into *row. Returns 0, or -1 after printing why. */
static int bench_shape_run(const tool_device *d, const bench_opts *o, const bench_meta *m,
                           const smla_cache *cache, tool_sampler *sampler, tool_rng *rng,
                           int64_t T, int N, bench_row *row) {
  const int dr = o->dr, dqk = BENCH_DQK(dr), K = o->topk;
  const int gpu = d->device >= 0;
  bench_shape b;
  memset(&b, 0, sizeof b);
  memset(row, 0, sizeof *row);
  row->tokens = T;
  row->heads = N;
  row->flops = 2.0 * (double)T * N * K * (dqk + BENCH_DV);
  row->bytes = (double)T * K * (double)m->row_bytes;

  b.dr = dr;
  b.q_set_bytes = (size_t)T * N * dqk * 2;
  b.slots_set_elems = (size_t)T * K;
  const double set_bytes = (double)b.q_set_bytes + 4.0 * (double)b.slots_set_elems;
  int sets = (int)ceil(BENCH_ROTATE_BYTES / row->bytes);
  if (sets > BENCH_MAX_SETS) sets = BENCH_MAX_SETS;
  if (sets * set_bytes > BENCH_MAX_SET_BYTES) sets = (int)(BENCH_MAX_SET_BYTES / set_bytes);
  if (sets < 2) sets = 2;
  b.sets = sets;

  const int graph = gpu && o->use_graph && T <= BENCH_GRAPH_MAX_T;
  const int per_graph = graph ? (sets > BENCH_GRAPH_MIN_FORWARDS ? sets : BENCH_GRAPH_MIN_FORWARDS)
                              : 1;
  int rc = -1;
  void *out = NULL, *lse = NULL, *bad = NULL, *d_req = NULL, *d_bt = NULL, *d_conv = NULL;
  uint16_t *h_q = NULL;
  int32_t *h_slots = NULL, *h_req = NULL, *h_bt = NULL;
  double *samples = NULL;
  tool_sampler positions = {0};

  b.q = tool_alloc(d, b.q_set_bytes * (size_t)sets);
  b.slots = tool_alloc(d, b.slots_set_elems * 4 * (size_t)sets);
  out = tool_alloc(d, (size_t)T * N * BENCH_DV * 2);
  lse = tool_alloc(d, (size_t)T * N * sizeof(float));
  bad = tool_alloc(d, sizeof(uint64_t));
  h_q = malloc(b.q_set_bytes);
  h_slots = malloc(b.slots_set_elems * sizeof *h_slots);
  if (!b.q || !b.slots || !out || !lse || !bad || !h_q || !h_slots) {
    if (!h_q || !h_slots) fprintf(stderr, "smla: out of host memory\n");
    goto done;
  }
  if (o->indices_bs) {
    /* Row t is request t: a context of 2K positions over B blocks drawn from the pool's
     * whole blocks; its K positions are distinct, so its rows are distinct as with slots. */
    const int bs = o->indices_bs;
    const int B = (int)((2 * (int64_t)K + bs - 1) / bs);
    const int64_t nblocks = cache->num_slots / bs;
    b.indices = 1;
    b.two_call = o->two_call;
    b.ctx = d->ctx;
    h_req = malloc((size_t)T * 4);
    h_bt = malloc((size_t)T * B * 4);
    if (!h_req || !h_bt || tool_sampler_init(&positions, (int64_t)B * bs)) {
      fprintf(stderr, "smla: out of host memory\n");
      goto done;
    }
    for (int64_t t = 0; t < T; t++) h_req[t] = (int32_t)t;
    for (int64_t i = 0; i < T * B; i++) h_bt[i] = (int32_t)tool_rng_below(rng, (uint64_t)nblocks);
    d_req = tool_alloc(d, (size_t)T * 4);
    d_bt = tool_alloc(d, (size_t)T * B * 4);
    if (o->two_call) d_conv = tool_alloc(d, (size_t)T * K * 4);
    if (!d_req || !d_bt || (o->two_call && !d_conv) ||
        tool_upload(d, d_req, h_req, (size_t)T * 4) ||
        tool_upload(d, d_bt, h_bt, (size_t)T * B * 4))
      goto done;
    smla_convert_params *c = &b.conv;
    c->num_tokens = T;
    c->topk = K;
    c->req_id = d_req;
    c->block_table = d_bt;
    c->num_requests = (int)T;
    c->blocks_per_request = B;
    c->block_table_stride = B;
    c->block_size = bs;
    c->local_stride = K;
    c->slots = d_conv;
    c->slots_stride = K;
  }
  for (int s = 0; s < sets; s++) {
    tool_fill_bf16(rng, h_q, b.q_set_bytes / 2, 1.0f);
    for (int64_t t = 0; t < T; t++)
      tool_sampler_draw(b.indices ? &positions : sampler, rng, h_slots + t * K, K);
    if (tool_upload(d, b.q + (size_t)s * b.q_set_bytes, h_q, b.q_set_bytes) ||
        tool_upload(d, b.slots + (size_t)s * b.slots_set_elems, h_slots,
                    b.slots_set_elems * 4))
      goto done;
  }
  if (tool_memset(d, bad, 0, sizeof(uint64_t))) goto done;

  /* One plan per shape, made for exactly this T, as an engine that captures a graph per
   * batch size would. */
  const uint32_t flags = (o->portable ? SMLA_PLAN_PORTABLE : 0u) |
                         (o->separate ? SMLA_PLAN_SEPARATE_MERGE : 0u);
  if (tool_plan(d, T, N, K, dr, o->format, o->splits, o->hb, flags, &b.plan))
    goto done;
  snprintf(row->path, sizeof row->path, "%s%s", smla_plan_describe(b.plan),
           !b.indices ? "" : b.two_call ? " [indices: convert, then forward]"
                                        : " [indices: smla_forward_indices]");
  tool_forward_params(&b.base, T, N, K, cache, NULL, NULL, out, lse, bad);
  smla_status st;

  int reps = o->reps;
  if (gpu) {
#ifdef SMLA_HAVE_CUDA
    if (!reps) reps = BENCH_GPU_REPS;
    const int most = reps > BENCH_COLD_REPS ? reps : BENCH_COLD_REPS;
    samples = malloc((size_t)most * sizeof *samples);
    if (!samples) goto done;
    if (o->timing & TIMING_COLD) {
      const int r = tool_cuda_time_cold(d->stream, bench_launch, &b, m->flush,
                                        BENCH_COLD_FLUSH_BYTES, BENCH_GPU_WARMUP,
                                        BENCH_COLD_REPS, samples);
      if (r > 0) tool_report(d, "smla_forward", (smla_status)r);
      if (r) goto done;
      row->cold_us = tool_median(samples, BENCH_COLD_REPS); /* sorts samples */
      row->cold_min_us = samples[0];
    }
    if (o->timing & TIMING_AMORTIZED) {
      const int r = tool_cuda_time(d->stream, bench_launch, &b, graph, per_graph,
                                   BENCH_GPU_WARMUP, reps, samples);
      if (r > 0) tool_report(d, "smla_forward", (smla_status)r);
      if (r) goto done;
    }
#endif
  } else {
    double t0 = tool_now_s();
    for (int i = 0; i < BENCH_CPU_WARMUP; i++) {
      st = (smla_status)bench_launch(&b, i, NULL);
      if (st != SMLA_OK) {
        tool_report(d, "smla_forward", st);
        goto done;
      }
    }
    const double warm_s = (tool_now_s() - t0) / BENCH_CPU_WARMUP;
    if (!reps) {
      reps = (int)(BENCH_CPU_BUDGET_S / (warm_s > 1e-9 ? warm_s : 1e-9));
      if (reps < BENCH_CPU_MIN_REPS) reps = BENCH_CPU_MIN_REPS;
      if (reps > BENCH_CPU_MAX_REPS) reps = BENCH_CPU_MAX_REPS;
    }
    samples = malloc((size_t)reps * sizeof *samples);
    if (!samples) goto done;
    for (int i = 0; i < reps; i++) {
      t0 = tool_now_s();
      st = (smla_status)bench_launch(&b, BENCH_CPU_WARMUP + i, NULL);
      samples[i] = (tool_now_s() - t0) * 1e6;
      if (st != SMLA_OK) {
        tool_report(d, "smla_forward", st);
        goto done;
      }
    }
  }
  if (tool_sync(d) || tool_download(d, &row->bad_inputs, bad, sizeof row->bad_inputs))
    goto done;

  row->reps = reps;
  row->graph = graph;
  row->per_graph = per_graph;
  row->sets = sets;
  if (o->timing & TIMING_AMORTIZED) {
    row->median_us = tool_median(samples, reps); /* sorts samples */
    row->min_us = samples[0];
  }
  row->rate_us = row->median_us > 0 ? row->median_us : row->cold_us;
  row->flop_per_s = row->flops / (row->rate_us * 1e-6);
  row->bytes_per_s = row->bytes / (row->rate_us * 1e-6);
  row->pct_flops = row->pct_bw = row->pct_roof = -1;
  if (m->copy_bytes_per_s > 0 && m->gemm_flop_per_s > 0) {
    const double t_flops = row->flops / m->gemm_flop_per_s;
    const double t_bytes = row->bytes / m->copy_bytes_per_s;
    row->pct_flops = 100.0 * row->flop_per_s / m->gemm_flop_per_s;
    row->pct_bw = 100.0 * row->bytes_per_s / m->copy_bytes_per_s;
    row->pct_roof = 100.0 * (t_flops > t_bytes ? t_flops : t_bytes) / (row->rate_us * 1e-6);
  }
  rc = 0;
done:
  smla_plan_destroy(b.plan);
  tool_free(d, d_req);
  tool_free(d, d_bt);
  tool_free(d, d_conv);
  free(h_req);
  free(h_bt);
  tool_sampler_free(&positions);
  tool_free(d, b.q);
  tool_free(d, b.slots);
  tool_free(d, out);
  tool_free(d, lse);
  tool_free(d, bad);
  free(h_q);
  free(h_slots);
  free(samples);
  return rc;
}

static void bench_print_row(const tool_device *d, const bench_row *r) {
  if (d->device >= 0) {
    char amort[16] = "-", cold[16] = "-";
    if (r->median_us > 0) snprintf(amort, sizeof amort, "%.2f", r->median_us);
    if (r->cold_us > 0) snprintf(cold, sizeof cold, "%.2f", r->cold_us);
    printf("%6lld %4d %11s %9s %9.2f %7.3f %7.1f %6.1f %6.1f  %s\n", (long long)r->tokens,
           r->heads, amort, cold, r->flop_per_s * 1e-12, r->bytes_per_s * 1e-12,
           r->pct_flops, r->pct_bw, r->pct_roof, r->path);
  }
  else
    printf("%6lld %4d %11.1f %9.4f %7.2f %5d  %s\n", (long long)r->tokens, r->heads,
           r->median_us, r->flop_per_s * 1e-12, r->bytes_per_s * 1e-9, r->reps, r->path);
  if (r->bad_inputs)
    printf("       warning: forward counted %llu bad inputs (expected 0)\n",
           (unsigned long long)r->bad_inputs);
  fflush(stdout);
}

/* --paths, one shape: the plan's own choice (rows[0]), then every distinct other path (by
 * its plan description). Prints one line: the chosen path's time against the fastest.
 * Returns 0, or -1 after printing why; *n: rows filled. */
static int bench_paths_shape(const tool_device *d, const bench_opts *o, const bench_meta *m,
                             const smla_cache *cache, tool_sampler *sampler, tool_rng *rng,
                             int64_t T, int N, bench_row *rows, int *n) {
  bench_opts v[BENCH_MAX_VARIANTS];
  int nv = 0;
  v[nv++] = *o; /* the plan's own choice */
  const int ntiles = (o->topk + 63) / 64;
  for (size_t i = 0; i < sizeof bench_paths_splits / sizeof *bench_paths_splits; i++) {
    const int sp = bench_paths_splits[i];
    if (sp > ntiles) break;
    for (int k = 0; k < 3 && nv < BENCH_MAX_VARIANTS; k++) {
      v[nv] = *o;
      v[nv].splits = sp;
      v[nv].separate = k == 1;
      v[nv].portable = k == 2;
      nv++;
    }
  }
  for (int k = 0; k < 2 && nv < BENCH_MAX_VARIANTS; k++) {
    v[nv] = *o;
    v[nv].portable = k == 0;
    v[nv].separate = k == 1;
    nv++;
  }
  /* Narrower head groups where few rows leave SMs idle: hb heads a block (fewer than the
   * N rounded up to 8, 16, 32 or 64, at most 8 groups), on either kernel, with the plan's
   * splits or 8, 16, 32 of them; on the plan's kernel also with the combine kernel only
   * (where that kernel may merge in-kernel, the forced splits do). */
  const int natural = N > 32 ? 64 : N > 16 ? 32 : N > 8 ? 16 : 8;
  static const int paths_hb_splits[] = {0, 8, 16, 32};
  for (int hb = 8; hb < natural && T <= 32; hb *= 2) {
    if ((N + hb - 1) / hb > 8) continue;
    for (int k = 0; k < 3; k++)
      for (size_t i = 0; i < sizeof paths_hb_splits / sizeof *paths_hb_splits; i++) {
        if (paths_hb_splits[i] > ntiles || nv >= BENCH_MAX_VARIANTS) continue;
        v[nv] = *o;
        v[nv].hb = hb;
        v[nv].portable = k == 1;
        v[nv].separate = k == 2;
        v[nv].splits = paths_hb_splits[i];
        nv++;
      }
  }
  char seen[BENCH_MAX_VARIANTS][SMLA_DESCRIBE_MAX];
  int nseen = 0;
  *n = 0;
  for (int i = 0; i < nv; i++) {
    const uint32_t flags = (v[i].portable ? SMLA_PLAN_PORTABLE : 0u) |
                           (v[i].separate ? SMLA_PLAN_SEPARATE_MERGE : 0u);
    smla_plan *probe = NULL;
    if (tool_plan(d, T, N, o->topk, o->dr, o->format, v[i].splits, v[i].hb, flags, &probe))
      return -1;
    int dup = 0;
    for (int j = 0; j < nseen && !dup; j++)
      dup = strcmp(seen[j], smla_plan_describe(probe)) == 0;
    if (!dup) snprintf(seen[nseen++], sizeof seen[0], "%s", smla_plan_describe(probe));
    smla_plan_destroy(probe);
    if (dup) continue;
    if (bench_shape_run(d, &v[i], m, cache, sampler, rng, T, N, &rows[*n])) return -1;
    (*n)++;
  }
  int best = 0;
  for (int i = 1; i < *n; i++)
    if (rows[i].rate_us < rows[best].rate_us) best = i;
  printf("%6lld %4d %10.2f %10.2f %7.3f %6d  %s\n", (long long)T, N, rows[0].rate_us,
         rows[best].rate_us, rows[0].rate_us / rows[best].rate_us, *n,
         best == 0 ? "(the chosen path)" : rows[best].path);
  fflush(stdout);
  return 0;
}

/* --paths, after every shape: how often the plan's choice is within 5% of the fastest
 * path (issue 22's criterion), and, when both N = 8 and N = 16 were timed, whether 8 heads
 * ever cost more than 16 at the same T. chosen, ratio: [heads][tokens]. */
static void bench_paths_summary(const bench_opts *o, const double *chosen, const double *ratio) {
  int within = 0, n = 0, worst = 0;
  for (int i = 0; i < o->num_heads * o->num_tokens; i++) {
    within += ratio[i] <= 1.05;
    if (ratio[i] > ratio[worst]) worst = i;
    n++;
  }
  printf("\nchosen path within 5%% of the fastest at %d of %d shapes; worst: T=%lld N=%lld, "
         "%.3fx\n", within, n, (long long)o->tokens[worst % o->num_tokens],
         (long long)o->heads[worst / o->num_tokens], ratio[worst]);
  int h8 = -1, h16 = -1;
  for (int h = 0; h < o->num_heads; h++) {
    if (o->heads[h] == 8) h8 = h;
    if (o->heads[h] == 16) h16 = h;
  }
  if (h8 < 0 || h16 < 0) return;
  int over = 0;
  double most = 0.0;
  printf("N=8 over N=16 (chosen paths):");
  for (int t = 0; t < o->num_tokens; t++) {
    const double q = chosen[h8 * o->num_tokens + t] / chosen[h16 * o->num_tokens + t];
    printf(" T=%lld %.3f", (long long)o->tokens[t], q);
    over += q > 1.0;
    if (q > most) most = q;
  }
  printf("\n  N=8 costs more than N=16 at %d of %d T (largest ratio %.3f)\n", over,
         o->num_tokens, most);
}

static int bench_parse(int argc, char **argv, bench_opts *o) {
  int device_given = 0, heads_given = 0, tokens_given = 0;
  memset(o, 0, sizeof *o);
  o->preset = "decode";
  o->topk = 2048;
  o->dr = 64;
  o->format = SMLA_CACHE_BF16;
  o->slots = 262144;
  o->seed = 1;
  o->use_graph = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long x;
    int used = 1; /* takes a value */
    const char *want = ""; /* the valid values, for the message */
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      bench_usage(stdout);
      exit(TOOL_EXIT_OK);
    } else if (strcmp(a, "--no-graph") == 0) {
      o->use_graph = 0;
      used = 0;
    } else if (strcmp(a, "--portable") == 0) {
      o->portable = 1;
      used = 0;
    } else if (strcmp(a, "--separate-merge") == 0) {
      o->separate = 1;
      used = 0;
    } else if (strcmp(a, "--paths") == 0) {
      o->paths = 1;
      used = 0;
    } else if (strcmp(a, "--two-call") == 0) {
      o->two_call = 1;
      used = 0;
    } else if (strcmp(a, "--indices") == 0) {
      want = "a block size 1..65536";
      if (tool_parse_int(v, 1, 65536, &x)) goto bad;
      o->indices_bs = (int)x;
    } else if (!v) {
      fprintf(stderr, "smla bench: %s needs a value\n", a);
      return -1;
    } else if (strcmp(a, "--preset") == 0) {
      want = "decode or prefill";
      if (strcmp(v, "decode") && strcmp(v, "prefill")) goto bad;
      o->preset = strcmp(v, "decode") == 0 ? "decode" : "prefill";
    } else if (strcmp(a, "--device") == 0) {
      want = "cpu or a CUDA device ordinal 0..1023";
      if (tool_parse_device(v, &o->device)) goto bad;
      device_given = 1;
    } else if (strcmp(a, "-N") == 0) {
      want = "a comma-separated list of up to 32 head counts, each 1..128";
      if ((o->num_heads = tool_parse_list(v, 1, SMLA_MAX_HEADS, o->heads, BENCH_MAX_LIST)) < 0)
        goto bad;
      heads_given = 1;
    } else if (strcmp(a, "-T") == 0) {
      want = "a comma-separated list of up to 32 token counts, each 1..1048576";
      if ((o->num_tokens = tool_parse_list(v, 1, 1 << 20, o->tokens, BENCH_MAX_LIST)) < 0)
        goto bad;
      tokens_given = 1;
    } else if (strcmp(a, "-K") == 0) {
      want = "an integer 1..1048576";
      if (tool_parse_int(v, 1, 1 << 20, &x)) goto bad;
      o->topk = (int)x;
    } else if (strcmp(a, "--dr") == 0) {
      want = "64 or 0";
      if (tool_parse_int(v, 0, 64, &x) || (x != 0 && x != 64)) goto bad;
      o->dr = (int)x;
    } else if (strcmp(a, "--format") == 0) {
      want = "bf16, fp8_tensor or fp8_ds";
      if (tool_parse_format(v, &o->format)) goto bad;
    } else if (strcmp(a, "--slots") == 0) {
      want = "an integer 1..2147483647";
      if (tool_parse_int(v, 1, INT32_MAX, &x)) goto bad;
      o->slots = x;
    } else if (strcmp(a, "--splits") == 0) {
      want = "an integer 1..1000000";
      if (tool_parse_int(v, 1, 1000000, &x)) goto bad;
      o->splits = (int)x;
    } else if (strcmp(a, "--heads-per-block") == 0) {
      want = "8, 16, 32 or 64";
      if (tool_parse_int(v, 8, 64, &x) || (x != 8 && x != 16 && x != 32 && x != 64)) goto bad;
      o->hb = (int)x;
    } else if (strcmp(a, "--timing") == 0) {
      want = "amortized, cold or both";
      if (strcmp(v, "amortized") == 0) o->timing = TIMING_AMORTIZED;
      else if (strcmp(v, "cold") == 0) o->timing = TIMING_COLD;
      else if (strcmp(v, "both") == 0) o->timing = TIMING_AMORTIZED | TIMING_COLD;
      else goto bad;
    } else if (strcmp(a, "--reps") == 0) {
      want = "an integer 1..1000000";
      if (tool_parse_int(v, 1, 1000000, &x)) goto bad;
      o->reps = (int)x;
    } else if (strcmp(a, "--seed") == 0) {
      want = "an integer 0..2^63-1";
      if (tool_parse_int(v, 0, INT64_MAX, &x)) goto bad;
      o->seed = (uint64_t)x;
    } else if (strcmp(a, "--threads") == 0) {
      want = "an integer 0..4096 (0: one per core)";
      if (tool_parse_int(v, 0, 4096, &x)) goto bad;
      o->threads = (int)x;
    } else if (strcmp(a, "--json") == 0) {
      o->json = v;
      /* Fail now, not after the run: the file is opened for appending (created if
       * missing, left as it is) to see that it can be written. */
      FILE *f = fopen(v, "a");
      if (!f) {
        fprintf(stderr, "smla bench: --json %s: cannot write it: %s\n", v, strerror(errno));
        return -1;
      }
      fclose(f);
    } else {
      fprintf(stderr, "smla bench: unknown option %s\n", a);
      return -1;
    }
    i += used;
    continue;
  bad:
    fprintf(stderr, "smla bench: bad value for %s: %s (want %s)\n", a, v, want);
    return -1;
  }
  if (!device_given) o->device = smla_cuda_device_count() > 0 ? 0 : SMLA_DEVICE_CPU;
  if (o->device < 0 && (o->timing & TIMING_COLD)) {
    fprintf(stderr, "smla bench: --timing %s needs a GPU (the CPU has amortized timing only)\n",
            o->timing == TIMING_COLD ? "cold" : "both");
    return -1;
  }
  if (!o->timing) o->timing = o->device >= 0 ? TIMING_AMORTIZED | TIMING_COLD : TIMING_AMORTIZED;
  if (o->paths && (o->splits || o->portable || o->separate || o->hb)) {
    fprintf(stderr, "smla bench: --paths tries every split and kernel itself: leave out "
                    "--splits, --heads-per-block, --portable and --separate-merge\n");
    return -1;
  }
  if (o->two_call && !o->indices_bs) {
    fprintf(stderr, "smla bench: --two-call needs --indices BS\n");
    return -1;
  }
  if (o->indices_bs && o->slots / o->indices_bs < 1) {
    fprintf(stderr, "smla bench: --indices %d is more than --slots %lld: no whole block\n",
            o->indices_bs, (long long)o->slots);
    return -1;
  }
  if (o->paths && !tokens_given) {
    o->num_tokens = (int)(sizeof bench_paths_tokens / sizeof *bench_paths_tokens);
    memcpy(o->tokens, bench_paths_tokens, sizeof bench_paths_tokens);
    tokens_given = 1;
  }
  if (o->paths && !heads_given) {
    o->num_heads = (int)(sizeof bench_paths_heads / sizeof *bench_paths_heads);
    memcpy(o->heads, bench_paths_heads, sizeof bench_paths_heads);
    heads_given = 1;
  }
  if (!tokens_given) {
    const int decode = strcmp(o->preset, "decode") == 0;
    const int64_t *src = decode ? bench_decode_tokens : bench_prefill_tokens;
    o->num_tokens = decode ? (int)(sizeof bench_decode_tokens / sizeof *src)
                           : (int)(sizeof bench_prefill_tokens / sizeof *src);
    memcpy(o->tokens, src, (size_t)o->num_tokens * sizeof *src);
  }
  if (!heads_given) {
    o->heads[0] = 16;
    o->heads[1] = 128;
    o->num_heads = 2;
  }
  if (o->topk > o->slots) {
    fprintf(stderr, "smla bench: -K %d is more than --slots %lld (slots are distinct per row)\n",
            o->topk, (long long)o->slots);
    return -1;
  }
  return 0;
}

/* A probe build of the library (NVCC_EXTRA=-DSMLA_PROBE=1, src/cuda/probe.cuh) defines
 * these; they print its kernels' phase stamps. Absent (NULL) in every other build. */
extern void smla_probe_dump_fwd(void) __attribute__((weak));
extern void smla_probe_dump_merge(void) __attribute__((weak));
extern void smla_probe_dump_fwd90(void) __attribute__((weak));

int tool_bench_main(int argc, char **argv, const char *command_line) {
  bench_opts o;
  if (bench_parse(argc, argv, &o)) {
    bench_usage(stderr);
    return TOOL_EXIT_USAGE;
  }
  tool_device d;
  if (tool_device_open(&d, o.device)) return TOOL_EXIT_FAIL;
  const int gpu = o.device >= 0;
  int rc = TOOL_EXIT_FAIL;
  bench_meta m;
  memset(&m, 0, sizeof m);
  m.command = command_line;
  m.row_bytes = smla_cache_row_size(o.format, o.dr);
  bench_row *rows = calloc((size_t)o.num_heads * o.num_tokens * (o.paths ? BENCH_MAX_VARIANTS : 1),
                           sizeof *rows);
  tool_sampler sampler = {0};
  smla_cache cache = {0};
  tool_rng rng;
  tool_rng_seed(&rng, o.seed);
  if (!rows || tool_sampler_init(&sampler, o.slots)) {
    fprintf(stderr, "smla: out of host memory\n");
    goto done;
  }
  if (!gpu && o.threads) {
    const smla_status s = smla_context_set_num_threads(d.ctx, o.threads);
    if (s != SMLA_OK) {
      tool_report(&d, "smla_context_set_num_threads", s);
      goto done;
    }
  }

  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (gpu) {
    if (smla_cuda_device_name(o.device, m.device_name, sizeof m.device_name) != SMLA_OK)
      snprintf(m.device_name, sizeof m.device_name, "CUDA device %d", o.device);
  } else {
    char model[192];
    cpu_model_name(model, sizeof model);
    char threads[32] = "";
    if (o.threads) snprintf(threads, sizeof threads, ", %d threads", o.threads);
    snprintf(m.device_name, sizeof m.device_name, "CPU: %s, %ld cores online%s", model, cores,
             threads);
  }
  const time_t now = time(NULL);
  struct tm tm_utc;
  gmtime_r(&now, &tm_utc);
  strftime(m.date, sizeof m.date, "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
  git_commit(m.commit, sizeof m.commit);
  if (gpu) {
    int n = 0;
    if (o.timing & TIMING_AMORTIZED)
      n = snprintf(m.timing, sizeof m.timing,
                   "median_us (amortized): CUDA events; T <= %d: CUDA-graph replays of >= %d "
                   "forwards on rotating inputs, per forward; median of %d samples after %d "
                   "warm-ups",
                   BENCH_GRAPH_MAX_T, BENCH_GRAPH_MIN_FORWARDS,
                   o.reps ? o.reps : BENCH_GPU_REPS, BENCH_GPU_WARMUP);
    if ((o.timing & TIMING_COLD) && n >= 0 && n < (int)sizeof m.timing)
      snprintf(m.timing + n, sizeof m.timing - (size_t)n,
               "%scold_us: one forward per CUDA-graph replay, %zu MiB zeroed before each "
               "(untimed), median of %d after %d warm-ups",
               n ? "; " : "", BENCH_COLD_FLUSH_BYTES >> 20, BENCH_COLD_REPS, BENCH_GPU_WARMUP);
  }
  else if (o.reps)
    snprintf(m.timing, sizeof m.timing,
             "clock_gettime around each call; median of %d after %d warm-up", o.reps,
             BENCH_CPU_WARMUP);
  else
    snprintf(m.timing, sizeof m.timing,
             "clock_gettime around each call; median of %d..%d calls (fewer than a GPU's "
             "%d: as many as fit in ~%.0f s per shape) after %d warm-up",
             BENCH_CPU_MIN_REPS, BENCH_CPU_MAX_REPS, BENCH_GPU_REPS, BENCH_CPU_BUDGET_S,
             BENCH_CPU_WARMUP);

  printf("smla bench (%s preset)\n", o.preset);
  printf("device   : %s\n", m.device_name);
  printf("smla     : %s (built with: %s)\n", smla_version_string(), smla_build_features());
  printf("date     : %s\n", m.date);
  printf("commit   : %s\n", m.commit);
  printf("command  : %s\n", command_line);
  printf("shapes   : Dqk %d, Dv %d, K %d, format %s (%zu B/row), pool %lld slots (%.0f MB), "
         "seed %llu\n",
         BENCH_DQK(o.dr), BENCH_DV, o.topk, tool_format_name(o.format), m.row_bytes,
         (long long)o.slots, (double)m.row_bytes * (double)o.slots * 1e-6,
         (unsigned long long)o.seed);
  printf("timing   : %s\n", m.timing);
  fflush(stdout);

  if (gpu) {
#ifdef SMLA_HAVE_CUDA
    if (tool_cuda_ceilings(d.stream, &m.copy_bytes_per_s, &m.gemm_flop_per_s)) goto done;
    if ((o.timing & TIMING_COLD) && !(m.flush = tool_alloc(&d, BENCH_COLD_FLUSH_BYTES)))
      goto done;
    printf("ceilings : copy %.2f TB/s (device-to-device, read+written), "
           "bf16 GEMM %.0f TFLOP/s (cuBLAS 8192^3)\n",
           m.copy_bytes_per_s * 1e-12, m.gemm_flop_per_s * 1e-12);
#endif
  } else {
    printf("ceilings : n/a on CPU\n");
  }

  cache.format = o.format;
  cache.dr = o.dr;
  cache.num_slots = o.slots;
  cache.row_bytes = (int64_t)m.row_bytes;
  cache.scale = 1.0f / 448.0f; /* FP8_TENSOR: data in +-1 spans the e4m3 range */
  cache.data = tool_alloc(&d, m.row_bytes * (size_t)o.slots);
  if (!cache.data) goto done;
  const double fill_t0 = tool_now_s();
  if (bench_fill_pool(&d, &cache, &rng)) goto done;
  printf("pool     : filled through smla_cache_write in %.2f s\n", tool_now_s() - fill_t0);

  if (o.paths)
    printf("\n%6s %4s %10s %10s %7s %6s  %s\n", "T", "N", "chosen_us", "best_us", "ratio",
           "paths", "fastest path (every path's row: --json)");
  else if (gpu)
    printf("\n%6s %4s %11s %9s %9s %7s %7s %6s %6s  %s\n", "T", "N", "median_us", "cold_us",
           "TFLOP/s", "TB/s", "%flops", "%bw", "%roof", "path");
  else
    printf("\n%6s %4s %11s %9s %7s %5s  %s\n", "T", "N", "median_us", "TFLOP/s", "GB/s",
           "reps", "path");
  int num_rows = 0;
  /* --paths: each shape's chosen time and its ratio to the fastest path, for the summary */
  double *chosen = calloc((size_t)o.num_heads * o.num_tokens, sizeof *chosen);
  double *ratio = calloc((size_t)o.num_heads * o.num_tokens, sizeof *ratio);
  if (!chosen || !ratio) {
    fprintf(stderr, "smla bench: out of host memory\n");
    free(chosen), free(ratio);
    goto done;
  }
  for (int h = 0; h < o.num_heads; h++)
    for (int t = 0; t < o.num_tokens; t++) {
      bench_row *r = &rows[num_rows];
      if (o.paths) {
        int n = 0;
        if (bench_paths_shape(&d, &o, &m, &cache, &sampler, &rng, o.tokens[t], (int)o.heads[h],
                              r, &n)) {
          free(chosen), free(ratio);
          goto done;
        }
        double best = r[0].rate_us;
        for (int i = 1; i < n; i++)
          if (r[i].rate_us < best) best = r[i].rate_us;
        chosen[h * o.num_tokens + t] = r[0].rate_us;
        ratio[h * o.num_tokens + t] = r[0].rate_us / best;
        num_rows += n;
        continue;
      }
      if (bench_shape_run(&d, &o, &m, &cache, &sampler, &rng, o.tokens[t], (int)o.heads[h], r))
        goto done;
      bench_print_row(&d, r);
      num_rows++;
    }
  if (o.paths) bench_paths_summary(&o, chosen, ratio);
  free(chosen), free(ratio);
  if (o.json) {
    if (bench_write_json(o.json, &o, &m, rows, num_rows)) goto done;
    printf("\nwrote %s\n", o.json);
  }
  rc = TOOL_EXIT_OK;
  if (smla_probe_dump_fwd) smla_probe_dump_fwd();
  if (smla_probe_dump_merge) smla_probe_dump_merge();
  if (smla_probe_dump_fwd90) smla_probe_dump_fwd90();
done:
  tool_free(&d, m.flush);
  tool_free(&d, cache.data);
  tool_sampler_free(&sampler);
  free(rows);
  tool_device_close(&d);
  return rc;
}
