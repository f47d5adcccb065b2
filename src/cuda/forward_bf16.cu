/* forward_bf16.cu: the generic forward for the BF16 cache; see forward_impl.cuh. */
#include "forward_impl.cuh"

SMLA_FWD_DEFINE(bf16, FMT_BF16)

/* The deepest KV pipeline the 16-head BF16 instance is built for (SMLA_FWD_MT1_TWO_BLOCKS:
 * 1, so that two blocks fit an SM). */
extern "C" int smla_cuda_fwd_mt1_max_pipe(void) { return SMLA_FWD_MT1_TWO_BLOCKS ? 1 : 2; }

PROBE_DEFINE_DUMP(smla_probe_dump_fwd)
