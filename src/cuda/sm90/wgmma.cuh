/*
 * wgmma.cuh: inline wrappers for the sm_90a warpgroup MMA PTX of the Hopper forward. Each
 * names the instruction it emits. All operands in shared memory are described by 64-bit
 * matrix descriptors (wg_desc); accumulators always accumulate (scale-d is a predicate
 * set true: zero them first). Compiled only for sm_90a (src/cuda/sm90/ builds with arch=compute_90a).
 */
#ifndef SMLA_CUDA_SM90_WGMMA_CUH
#define SMLA_CUDA_SM90_WGMMA_CUH

#include <stdint.h>

/* Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
 * byte offsets (all in 16-byte units), layout type 1 (SWIZZLE_128B) in bits 62-63.
 * K-major operands: lbo unused (16), sbo = 1024 (8 rows of 128 bytes). MN-major: lbo =
 * bytes between 64-element column blocks, sbo = bytes between 8-row groups along K. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* wgmma.fence.sync.aligned: orders register accesses before the next wgmma.mma_async. */
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

/* wgmma.commit_group.sync.aligned */
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* wgmma.wait_group.sync.aligned N: at most N committed groups still pending. */
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* An empty asm that "writes" v: keeps the compiler from moving reads or writes of an
 * accumulator across the wgmma issue / wait around it. */
__device__ __forceinline__ void wg_pin(float &v) { asm volatile("" : "+f"(v)::"memory"); }

/* fence.proxy.async.shared::cta: this thread's generic-proxy shared-memory writes
 * (st.shared, cp.async) become visible to the async proxy (wgmma operand reads). */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* The "+f" operands of a wgmma accumulator of 32 or 64 floats, d[0] .. d[N-1]. */
#define WG_F8(d, i)                                                                        \
  "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]),    \
      "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define WG_ACC32(d) WG_F8(d, 0), WG_F8(d, 8), WG_F8(d, 16), WG_F8(d, 24)
#define WG_ACC64(d) WG_ACC32(d), WG_F8(d, 32), WG_F8(d, 40), WG_F8(d, 48), WG_F8(d, 56)

/* wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16: d[64x128] += A[64x16] B[16x128],
 * A K-major, B MN-major (imm-trans-b = 1) in shared memory. */
__device__ __forceinline__ void wgmma_m64n128k16_ss_tb(float d[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 1;\n}\n"
      :
        WG_ACC64(d)
      : "l"(da), "l"(db), "n"(1));
}


/* wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16: d[64x64] += A[64x16] B[16x64],
 * A and B K-major in shared memory (v11's whole-tile S). */
__device__ __forceinline__ void wgmma_m64n64k16_ss(float d[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      :
        WG_ACC32(d)
      : "l"(da), "l"(db), "n"(1));
}

/* wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16: d[64x48] += A[64x16] B[16x48], A
 * and B K-major in shared memory (bench/wgmma_s.cu's n48 way: v23's S, code at 37bc82a). */
__device__ __forceinline__ void wgmma_m64n48k16_ss(float d[24], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, %24, %25, p, 1, 1, 0, 0;\n}\n"
      : WG_F8(d, 0), WG_F8(d, 8), WG_F8(d, 16)
      : "l"(da), "l"(db), "n"(1));
}

/* wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 for N = 8, 16, 32: d[64xN] +=
 * A[64x16] B[16xN], both in shared memory, B K-major; A K-major (TA = 0: Q in
 * bench/wgmma_s.cu's 32-row S, K rows in the small-head kernel's S^T = K Q^T) or MN-major
 * (TA = 1, imm-trans-a: V^T in the small-head kernel's O^T += V^T P^T, read from the rows
 * of V). d: N / 2 floats a thread. */
template <int TA = 0>
__device__ __forceinline__ void wgmma_m64n8k16_ss(float d[4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3}, %4, %5, p, 1, 1, %7, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "n"(1), "n"(TA));
}

template <int TA = 0>
__device__ __forceinline__ void wgmma_m64n16k16_ss(float d[8], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : WG_F8(d, 0)
      : "l"(da), "l"(db), "n"(1), "n"(TA));
}

template <int TA = 0>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float d[16], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
      : WG_F8(d, 0), WG_F8(d, 8)
      : "l"(da), "l"(db), "n"(1), "n"(TA));
}

/* The one for N (8, 16, 32, 48 or 64; TA = 1, A MN-major, for N <= 32 only). */
template <int N, int TA>
__device__ __forceinline__ void wgmma_m64nNk16_ss(float *d, uint64_t da, uint64_t db) {
  static_assert(N == 8 || N == 16 || N == 32 || ((N == 48 || N == 64) && TA == 0),
                "N = 8, 16, 32, 48 or 64");
  if constexpr (N == 8) wgmma_m64n8k16_ss<TA>(d, da, db);
  else if constexpr (N == 16) wgmma_m64n16k16_ss<TA>(d, da, db);
  else if constexpr (N == 32) wgmma_m64n32k16_ss<TA>(d, da, db);
  else if constexpr (N == 48) wgmma_m64n48k16_ss(d, da, db);
  else wgmma_m64n64k16_ss(d, da, db);
}

/* An S tile issued as one commit group: s (N / 2 floats a thread) zeroed, then KB x 4
 * wgmma m64nNk16 over the 576 (or 512) columns, A and B both K-major stacks of KB column
 * blocks in the 128-byte swizzle: A's 64 rows from a_s, its blocks a_kb bytes apart, B's
 * N rows from b_s, b_kb apart. S = Q K^T (v11, A = Q) or S^T = K Q^T (the small-head
 * kernel, A = the stage's K rows, B = Q's HG rows). The caller waits. */
template <int N, int KB>
__device__ __forceinline__ void wg_s_issue(float *s, uint32_t a_s, uint32_t a_kb, uint32_t b_s,
                                           uint32_t b_kb) {
#pragma unroll
  for (int i = 0; i < N / 2; i++) s[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; i++) wg_pin(s[i]);
  wg_fence();
#pragma unroll
  for (int kb = 0; kb < KB; kb++)
#pragma unroll
    for (int k4 = 0; k4 < 4; k4++)
      wgmma_m64nNk16_ss<N, 0>(s, wg_desc(a_s + kb * a_kb + k4 * 32, 16, 1024),
                              wg_desc(b_s + kb * b_kb + k4 * 32, 16, 1024));
  wg_commit();
}

/* wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 with A in registers: d[64x128] +=
 * A[64x16] B[16x128], B MN-major (imm-trans-b = 1) in shared memory. a: this thread's A
 * fragment (rows g and g + 8 of its warp's 16, columns 2 tig and 8 + 2 tig: the layout
 * of an m64nNk16 accumulator's 16 columns, packed to bf16 pairs). The registers are read
 * asynchronously: they must not change before the wait that covers this wgmma. */
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float d[64], const uint32_t a[4],
                                                       uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      :
        WG_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
}

/* ---- mbarriers (shared::cta), for the warp-specialized forward ---------------------------- */

/* mbarrier.init.shared::cta.b64 [bar], count */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* mbarrier.arrive.shared::cta.b64 (release at CTA scope): one of the phase's arrivals. */
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* cp.async.mbarrier.arrive.noinc.shared::cta.b64: one of the phase's arrivals, made when
 * every cp.async this thread issued before has landed (the barrier's count includes it). */
__device__ __forceinline__ void mbar_arrive_cp_async_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

/* Spins on mbarrier.try_wait.parity (acquire at CTA scope) until the phase of that
 * parity has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

/* bar.sync id, n: a named barrier of n threads (a multiple of 32). */
__device__ __forceinline__ void named_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* bar.arrive id, n: this warp's arrival on named barrier id (n threads), without waiting. */
__device__ __forceinline__ void named_bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* The cluster barrier and distributed shared-memory loads: ptx.cuh. */

#endif /* SMLA_CUDA_SM90_WGMMA_CUH */
