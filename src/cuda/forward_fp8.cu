/* forward_fp8.cu: the generic forward for the FP8_TENSOR cache; see forward_impl.cuh. */
#include "forward_impl.cuh"

SMLA_FWD_DEFINE(fp8, FMT_FP8)
