/* fusedk_tensor and the managed structs are layout-identical to DLPack's: checked against the
   real dlpack.h at compile time. (Debian's dlpack.h predates DLManagedTensorVersioned, whose
   offsets are pinned to the DLPack 1.x ABI below.) */
#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdio.h>

#include "fusedk.h"

#define SAME(a, b) _Static_assert(sizeof(a) == sizeof(b), #a " vs " #b)
#define AT(a, fa, b, fb) _Static_assert(offsetof(a, fa) == offsetof(b, fb), #a "." #fa " vs " #b "." #fb)

SAME(fusedk_tensor, DLTensor);
AT(fusedk_tensor, data, DLTensor, data);
AT(fusedk_tensor, device, DLTensor, device);
AT(fusedk_tensor, ndim, DLTensor, ndim);
AT(fusedk_tensor, dtype, DLTensor, dtype);
AT(fusedk_tensor, shape, DLTensor, shape);
AT(fusedk_tensor, strides, DLTensor, strides);
AT(fusedk_tensor, byte_offset, DLTensor, byte_offset);
SAME(fusedk_device, DLDevice);
AT(fusedk_device, device_type, DLDevice, device_type);
AT(fusedk_device, device_id, DLDevice, device_id);
SAME(fusedk_dtype, DLDataType);
AT(fusedk_dtype, code, DLDataType, code);
AT(fusedk_dtype, bits, DLDataType, bits);
AT(fusedk_dtype, lanes, DLDataType, lanes);
SAME(fusedk_dlmanaged, DLManagedTensor);
AT(fusedk_dlmanaged, dl_tensor, DLManagedTensor, dl_tensor);
AT(fusedk_dlmanaged, manager_ctx, DLManagedTensor, manager_ctx);
AT(fusedk_dlmanaged, deleter, DLManagedTensor, deleter);
_Static_assert((int)FUSEDK_DEVICE_CPU == (int)kDLCPU && (int)FUSEDK_DEVICE_CUDA == (int)kDLCUDA, "device types");
_Static_assert((int)FUSEDK_DEVICE_CUDA_HOST == (int)kDLCUDAHost && (int)FUSEDK_DEVICE_CUDA_MANAGED == (int)kDLCUDAManaged, "device types");
_Static_assert((int)FUSEDK_DTYPE_FLOAT == (int)kDLFloat && (int)FUSEDK_DTYPE_BFLOAT == (int)kDLBfloat, "dtype codes");
/* DLManagedTensorVersioned (DLPack >= 1.0): version@0, manager_ctx@8, deleter@16, flags@24,
   dl_tensor@32; 80 bytes */
_Static_assert(offsetof(fusedk_dlmanaged_versioned, manager_ctx) == 8, "versioned.manager_ctx");
_Static_assert(offsetof(fusedk_dlmanaged_versioned, deleter) == 16, "versioned.deleter");
_Static_assert(offsetof(fusedk_dlmanaged_versioned, flags) == 24, "versioned.flags");
_Static_assert(offsetof(fusedk_dlmanaged_versioned, dl_tensor) == 32, "versioned.dl_tensor");
_Static_assert(sizeof(fusedk_dlmanaged_versioned) == 80, "versioned size");

int main(void) {
  /* a DLTensor from a framework passes as-is */
  DLTensor t = {0};
  const fusedk_tensor *f = (const fusedk_tensor *)&t;
  printf("ok: fusedk_tensor == DLTensor (%zu bytes, dlpack %d)\n", sizeof *f, DLPACK_VERSION);
  return 0;
}
