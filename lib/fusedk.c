/* The library build of fusedk.h: the CPU references, and with FUSEDK_CUDA the dispatch to
   fusedk_kernels.cu. C users can do the same in any one of their own files. */
#define FUSEDK_IMPLEMENTATION
#include "fusedk.h"
