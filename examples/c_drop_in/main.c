/* A C program using fusedk as two dropped-in files: fusedk.h (+ fusedk_kernels.cu for the GPU),
   or linked with an installed libfusedk. Build without meson: see the Makefile (CPU: one cc line;
   GPU: + nvcc, -DFUSEDK_CUDA; installed: pkg-config, -DFUSEDK_INSTALLED). */
#ifndef FUSEDK_INSTALLED /* libfusedk has the implementation: defining it again would clash */
#define FUSEDK_IMPLEMENTATION
#endif
#include "fusedk.h"

#include <math.h>
#include <stdio.h>

int main(void) {
  float x[2][4] = {{1, 2, 3, 4}, {-1, 0, 1, 2}}, w[4] = {1, 1, 2, 2}, y[2][4];
  int64_t xs[2] = {2, 4}, ws[1] = {4};
  fusedk_tensor tx = fusedk_tensor_cpu(x, FUSEDK_F32, 2, xs), ty = fusedk_tensor_cpu(y, FUSEDK_F32, 2, xs);
  fusedk_tensor tw = fusedk_tensor_cpu(w, FUSEDK_F32, 1, ws);
  if (fusedk_rmsnorm(&ty, NULL, &tx, NULL, &tw, 1e-6f, NULL) != FUSEDK_OK) {
    fprintf(stderr, "rmsnorm: %s\n", fusedk_failure_reason());
    return 1;
  }
  double rms0 = sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  printf("y[0] = %.6f %.6f %.6f %.6f (expected %.6f ...)\n", y[0][0], y[0][1], y[0][2], y[0][3], 1 / rms0);
  tw.shape[0] = 3; /* a wrong weight: a status and a reason, nothing written */
  fusedk_status st = fusedk_rmsnorm(&ty, NULL, &tx, NULL, &tw, 1e-6f, NULL);
  printf("%s: %s\n", fusedk_status_name(st), fusedk_failure_reason());
#if defined(FUSEDK_INSTALLED)
  printf("installed libfusedk %s, %d CUDA device(s)\n", fusedk_version(), fusedk_cuda_device_count());
#elif defined(FUSEDK_CUDA)
  printf("GPU half linked, %d CUDA device(s)\n", fusedk_cuda_device_count());
#else
  printf("CPU-only build\n");
#endif
  return fabs(y[0][0] - 1 / rms0) < 1e-6 && st == FUSEDK_ERR_SHAPE ? 0 : 1;
}
