/* forward_ds.cu: the generic forward for the FP8_DS cache (FlashMLA V3.2 layout); see
 * forward_impl.cuh. */
#include "forward_impl.cuh"

SMLA_FWD_DEFINE(ds, FMT_DS)
