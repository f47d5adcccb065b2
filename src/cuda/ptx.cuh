/*
 * ptx.cuh: inline wrappers for the sm_80 PTX the generic kernels use. Each names the
 * instruction it emits. Shared-memory operands are 32-bit shared-window addresses
 * (smem_addr()).
 */
#ifndef SMLA_CUDA_PTX_CUH
#define SMLA_CUDA_PTX_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* SMLA_CP_ASYNC_L2_256B=1 (experiment, issue 21; build with NVCC_EXTRA=-D...): every
 * cp.async asks L2 to fetch the whole 256-byte block around it (.L2::256B), as FlashMLA's
 * gathers do: fewer, larger DRAM requests for a 1152-byte row, at up to 11% more bytes
 * (a row spans five 256-byte blocks). Measured in docs/design/cuda-sm90-forward.md. */
#ifndef SMLA_CP_ASYNC_L2_256B
#define SMLA_CP_ASYNC_L2_256B 0
#endif

/* SMLA_CP_ASYNC_EVICT_LAST=1 (experiment; measured in session 11, no gain, off: bench/
 * RESULTS.md, session 11): every cp.async carries an
 * L2 evict_last cache policy, as FlashMLA's gathers do, so that a row the other head
 * group's block (N = 128) reads soon after is still in L2; at N <= 64 a row is read once
 * and the hint can only crowd L2. */
#ifndef SMLA_CP_ASYNC_EVICT_LAST
#define SMLA_CP_ASYNC_EVICT_LAST 0
#endif

/* createpolicy.fractional.L2::evict_last.b64 policy, 1.0: an L2 policy that keeps the
 * lines it covers over evict_normal ones (not volatile: one per thread after CSE). */
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

/* cp.async.cg.shared.global [dst], [src], 16, src_bytes: copies src_bytes (0 or 16) and
 * zero-fills the rest of the 16 bytes; with src_bytes = 0 nothing is read. L1 bypassed. */
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, uint32_t src_bytes) {
#if SMLA_CP_ASYNC_EVICT_LAST
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(src_bytes), "l"(l2_policy_evict_last())
               : "memory");
#elif SMLA_CP_ASYNC_L2_256B
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
#endif
}

/* cp.async.commit_group */
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* cp.async.wait_group N: at most N of this thread's groups still pending. */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices; lane l gives the
 * address of row l % 8 of matrix l / 8; r[i] is this lane's fragment of matrix i. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* ldmatrix.sync.aligned.m8n8.x2.shared.b16 (lanes 0..15 give the addresses). */
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

/* ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: as ldmatrix_x4, each matrix transposed. */
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d += a * b (16x16 by 16x8). */
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ex2.approx.ftz.f32: 2^x, relative error ~2^-22; ex2(-inf) = 0, NaN stays NaN. */
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* max.NaN.f32: the larger of a and b, NaN if either is NaN (fmaxf would drop it). */
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

/* ld.global.nc.v4.u32: 16 bytes through the read-only path. */
__device__ __forceinline__ uint4 ld_nc_16(const void *p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/* ---- sm_90 only (call under __CUDA_ARCH__ >= 900): clusters, programmatic launch ---- */

/* barrier.cluster.arrive.release / wait.acquire (.aligned: every thread of the warp):
 * all non-exited threads of every block of the cluster; the release/acquire pair orders
 * shared and global memory at cluster scope. */
__device__ __forceinline__ void cluster_sync_acq_rel() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/* barrier.cluster.arrive.release.aligned: this thread's earlier accesses (distributed
 * shared-memory reads included) are done before the others' matching wait returns. */
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

/* barrier.cluster.wait.aligned: until every thread of the cluster has arrived. */
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

/* mapa.shared::cluster.u32: shared address saddr (this block's layout) in cluster block
 * `rank`'s shared memory. */
__device__ __forceinline__ uint32_t cluster_map(uint32_t saddr, uint32_t rank) {
  uint32_t ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(saddr), "r"(rank));
  return ra;
}

/* ld.shared::cluster.f32: the float at shared address saddr of cluster block `rank`. */
__device__ __forceinline__ float ld_cluster_f32(uint32_t saddr, uint32_t rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n"
               : "=f"(v) : "r"(cluster_map(saddr, rank)) : "memory");
  return v;
}

/* ld.shared::cluster.v4.f32: 16 bytes at shared address saddr of cluster block `rank`. */
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t saddr, uint32_t rank) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(cluster_map(saddr, rank)) : "memory");
  return v;
}

/* griddepcontrol.wait: until the grids this one depends on programmatically have completed
 * and their writes are visible (a no-op in a plain launch). */
__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

/* griddepcontrol.launch_dependents: a programmatic dependent may be scheduled once every
 * block of this grid has issued it (or exited). */
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

#endif /* SMLA_CUDA_PTX_CUH */
