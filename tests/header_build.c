/* The header's implementation built on its own (C99 here, C++17 in header_build.cpp) with
   -Wall -Wextra -Werror, and one op run through it: proves the single-header use compiles and
   links with libm alone. */
#define FUSEDK_IMPLEMENTATION
#include "fusedk.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {0};
  int64_t shape[2] = {2, 3};
  fusedk_tensor tx = fusedk_tensor_cpu(x, FUSEDK_F32, 2, shape), ty = fusedk_tensor_cpu(y, FUSEDK_F32, 2, shape);
  fusedk_status st = fusedk_rmsnorm(&ty, NULL, &tx, NULL, NULL, 0.0f, NULL);
  /* row 0: rms = sqrt(14/3) */
  double want = 1.0 / sqrt(14.0 / 3.0);
  if (st != FUSEDK_OK || fabs(y[0] - want) > 1e-6) {
    printf("FAIL: %s %s y0=%g want %g\n", fusedk_status_name(st), fusedk_failure_reason(), (double)y[0], want);
    return 1;
  }
  /* a CUDA tensor without the GPU half: NO_CUDA, with a reason saying how to enable it */
  fusedk_tensor gx = fusedk_tensor_cuda(x, FUSEDK_F32, 2, shape, 0), gy = fusedk_tensor_cuda(y, FUSEDK_F32, 2, shape, 0);
  st = fusedk_rmsnorm(&gy, NULL, &gx, NULL, NULL, 1e-6f, NULL);
  if (st != FUSEDK_ERR_NO_CUDA || !strstr(fusedk_failure_reason(), "fusedk_kernels.cu") ||
      strncmp(fusedk_failure_reason(), "rmsnorm: ", 9) != 0) {
    printf("FAIL: expected NO_CUDA, got %s: %s\n", fusedk_status_name(st), fusedk_failure_reason());
    return 1;
  }
  printf("ok: fusedk %s header build\n", fusedk_version());
  return 0;
}
