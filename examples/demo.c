/* fusedk demo: RMSNorm and the Mochi gated residual on a DiT-sized activation. Runs the CPU
   reference always and, when the library has its GPU half and a GPU is present, the kernel too:
   prints the largest difference between them and the kernel time.
   Build: part of `meson compile -C build`; run: build/fusedk_demo */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fusedk.h"
#ifdef FUSEDK_DEMO_CUDA
#include <cuda_runtime.h>
#endif

static float frand(unsigned *s) { /* xorshift, uniform in [-1, 1) */
  *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
  return (float)(*s & 0xffffff) / 8388608.0f - 1.0f;
}

int main(void) {
  enum { B = 2, L = 1024, D = 3072 };
  const size_t n = (size_t)B * L * D;
  int64_t shape[3] = {B, L, D}, wshape[1] = {D}, gshape[2] = {B, D};
  float *x = malloc(n * 4), *xr = malloc(n * 4), *y = malloc(n * 4), *w = malloc(D * 4), *g = malloc(B * D * 4);
  unsigned seed = 1;
  for (size_t i = 0; i < n; ++i) x[i] = frand(&seed), xr[i] = 2.0f * frand(&seed);
  for (int i = 0; i < D; ++i) w[i] = 1.0f + 0.1f * frand(&seed);
  for (int i = 0; i < B * D; ++i) g[i] = frand(&seed);

  fusedk_tensor tx = fusedk_tensor_cpu(x, FUSEDK_F32, 3, shape), txr = fusedk_tensor_cpu(xr, FUSEDK_F32, 3, shape);
  fusedk_tensor ty = fusedk_tensor_cpu(y, FUSEDK_F32, 3, shape), tw = fusedk_tensor_cpu(w, FUSEDK_F32, 1, wshape);
  fusedk_tensor tg = fusedk_tensor_cpu(g, FUSEDK_F32, 2, gshape);
  printf("fusedk %s, %d CUDA device(s)\n", fusedk_version(), fusedk_cuda_device_count());

  if (fusedk_rmsnorm(&ty, NULL, &tx, NULL, &tw, 1e-6f, NULL) != FUSEDK_OK) {
    printf("rmsnorm failed: %s\n", fusedk_failure_reason());
    return 1;
  }
  printf("cpu  rmsnorm [%d, %d, %d] f32: y[0..3] = %.5f %.5f %.5f\n", B, L, D, y[0], y[1], y[2]);
  if (fusedk_residual_tanh_gated_rmsnorm(&ty, &tx, &txr, &tg, 1e-6f, 1, NULL) != FUSEDK_OK) {
    printf("residual_tanh_gated_rmsnorm failed: %s\n", fusedk_failure_reason());
    return 1;
  }
  printf("cpu  residual_tanh_gated_rmsnorm: y[0..3] = %.5f %.5f %.5f\n", y[0], y[1], y[2]);

#ifdef FUSEDK_DEMO_CUDA
  if (fusedk_cuda_device_count() > 0) {
    float *dx, *dxr, *dy, *dg, *gy = malloc(n * 4);
    cudaMalloc((void **)&dx, n * 4), cudaMalloc((void **)&dxr, n * 4), cudaMalloc((void **)&dy, n * 4);
    cudaMalloc((void **)&dg, B * D * 4);
    cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice), cudaMemcpy(dxr, xr, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dg, g, B * D * 4, cudaMemcpyHostToDevice);
    fusedk_tensor gx = fusedk_tensor_cuda(dx, FUSEDK_F32, 3, shape, 0), gxr = fusedk_tensor_cuda(dxr, FUSEDK_F32, 3, shape, 0);
    fusedk_tensor gyt = fusedk_tensor_cuda(dy, FUSEDK_F32, 3, shape, 0), ggt = fusedk_tensor_cuda(dg, FUSEDK_F32, 2, gshape, 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    fusedk_status st = fusedk_residual_tanh_gated_rmsnorm(&gyt, &gx, &gxr, &ggt, 1e-6f, 1, NULL); /* warm-up */
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 20; ++i) st |= fusedk_residual_tanh_gated_rmsnorm(&gyt, &gx, &gxr, &ggt, 1e-6f, 1, NULL);
    cudaEventRecord(e1, 0);
    cudaMemcpy(gy, dy, n * 4, cudaMemcpyDeviceToHost);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    double md = 0;
    for (size_t i = 0; i < n; ++i) md = fmax(md, fabs((double)gy[i] - y[i]));
    printf("gpu  residual_tanh_gated_rmsnorm: %s, max |gpu - cpu| = %.3g, %.1f us/call (%.0f GB/s)\n",
           st ? fusedk_failure_reason() : "ok", md, ms * 1000 / 20, 3.0 * n * 4 / (ms / 20 * 1e6));
    return st || md > 1e-4;
  }
  printf("no GPU: CPU references only\n");
#else
  printf("built without the GPU half: CPU references only\n");
#endif
  return 0;
}
