/* forward_bf16.cu: the generic forward for the BF16 cache; see forward_impl.cuh. */
#include "forward_impl.cuh"

SMLA_FWD_DEFINE(bf16, FMT_BF16)

PROBE_DEFINE_DUMP(smla_probe_dump_fwd)
