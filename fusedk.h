/* fusedk.h - fused GPU kernels for diffusion and transformer blocks, with CPU references.
   MIT licensed (see LICENSE). Version in FUSEDK_VERSION_*.

   WHAT IT IS
     The API of fusedk and the CPU reference implementation of every op. The GPU half lives in
     one other file, fusedk_kernels.cu. Where the tensors live decides where an op runs: CPU (and
     CUDA-host) tensors run the reference here, CUDA (and CUDA-managed) tensors run the kernel.

   USING IT
     CPU only:   in ONE C or C++ file
                     #define FUSEDK_IMPLEMENTATION
                     #include "fusedk.h"
                 links with libm only, needs no CUDA header.
     With a GPU: the same file also defines FUSEDK_CUDA before the include, and the build also
                 compiles fusedk_kernels.cu with nvcc and links cudart and cublasLt:
                     nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
                          -gencode=arch=compute_80,code=[sm_80,compute_80] -c fusedk_kernels.cu
                 Without FUSEDK_CUDA the library still links; an op given CUDA tensors then
                 returns FUSEDK_ERR_NO_CUDA and fusedk_failure_reason() says how to enable it.
     Every other file just includes "fusedk.h".

   THE OPS   (D = last dim, normalized; [B,D] vectors broadcast over the L tokens of sample b;
              all math in float32 on the GPU, float64 in the CPU references; one rounding to the
              output dtype unless a mode says otherwise)
     fusedk_rmsnorm      r = x + residual (if given; written to residual_out if given)
                         y = r * rsqrt(mean(r^2) + eps) * weight            (weight optional)
     fusedk_layernorm    y = (x - mean(x)) * rsqrt(var(x) + eps) * weight + bias
                         (biased variance; weight and bias optional)
     fusedk_adaln        y = norm(x) * (1 + scale[b]) + shift[b],   norm = LayerNorm or RMSNorm
                         (with optional weight/bias inside norm); scale/shift may be strided
                         views into a [B, k*D] AdaLN-Zero modulation tensor
     fusedk_residual_tanh_gated_rmsnorm   (Mochi)
                         y = x + cast( x_res * rsqrt(mean(x_res^2) + eps) * tanh(gate[b]) )
                         exact=1: PyTorch's rounding points (tanh(gate) rounded to the dtype,
                         x_res*rstd*tanh in float32, rounded to the dtype, then added in float32
                         and rounded again); exact=0: one rounding at the end.

     fusedk_act          y = act(x), act = gelu (erf) | gelu_tanh | silu | relu
     fusedk_silu_fma     y = silu(a + b * c)
     fusedk_gated_residual   out = x + gate[b] * y       (gate [B, D], a modulation chunk)
     fusedk_glu          x[..., 2H] -> y[..., H] = act(one half) * the other half
     fusedk_glu_pair     y = value * act(gate)

   TENSORS
     fusedk_tensor is layout-identical to DLPack's DLTensor: a DLTensor* from any framework can
     be passed as (const fusedk_tensor *). Strides are in elements, NULL = compact row-major.
     The normalized (last) dim must be contiguous; every other stride is honoured, stride 0
     broadcasts inputs. Outputs may alias an input only exactly (same pointer and strides).
     dtypes: float32, float16, bfloat16; all tensors of one call share x's dtype and device.

   ERRORS
     Every call returns fusedk_status. On failure nothing is launched or written and
     fusedk_failure_reason() (thread-local) names the op, the argument and what was expected.
     The library never prints, exits or aborts.

   STREAMS
     The last argument of every op: a cudaStream_t passed as struct CUstream_st* (NULL = legacy
     default stream). GPU ops are stream-ordered, allocation-free and CUDA-graph capturable.

   CONFIGURATION (define before including)
     FUSEDK_IMPLEMENTATION   in one translation unit: emit the implementation.
     FUSEDK_CUDA             with FUSEDK_IMPLEMENTATION: route CUDA tensors to fusedk_kernels.cu.
     FUSEDK_STATIC           make every function static (CPU-only use inside one file).
     FUSEDK_DEF              override the linkage/visibility of the public functions.
     FUSEDK_MAX_DIMS         largest ndim accepted (default 8; set the same everywhere).

   CONTENTS   (section tags: grep "[norm]" finds a family in this file, in fusedk_kernels.cu,
              tests/ and bench/)
     declarations     [api] types, statuses, tensors   [dlpack] memory and streams
                      [norm] the normalization ops     [elementwise] activations, fused residuals
                      [registry] every op's arguments as data
     implementation   [errors] [tensors] [registry] [validate] [numerics] [norm] [elementwise]
                      (CPU references and entry points) [dlpack] [info]
     GPU half         fusedk_kernels.cu: [runtime] [dispatch] [numerics] [memory] [reduce] [norm]
                      [elementwise] [entry]

   ADDING AN OP
     An fusedk_op_id at the end of the enum, its registry entry (arguments in C order with kind
     and role, attributes with defaults), its entry point (fusedk__validate, then the op's own
     checks), its CPU reference and its kernel in its family's section; fusedk_op_call's switch.
     kernel_info, the Python functions' registry order, the torch ops and the XLA handlers follow
     the registry.

   VERSIONING
     FUSEDK_VERSION_MAJOR changes when the C ABI or an op's semantics change incompatibly,
     MINOR when ops or arguments are added (enums only grow), PATCH for fixes and speed. While
     MAJOR is 0, a MINOR release may change the ABI: 0.3 added fields to fusedk_op and
     fusedk_op_tensor (argument roles); rebuild against the header you link.
*/
#ifndef FUSEDK_H
#define FUSEDK_H

#include <stddef.h>
#include <stdint.h>

#define FUSEDK_VERSION_MAJOR 0
#define FUSEDK_VERSION_MINOR 3
#define FUSEDK_VERSION_PATCH 0

#ifndef FUSEDK_MAX_DIMS
#define FUSEDK_MAX_DIMS 8
#endif

#ifndef FUSEDK_DEF
#if defined(FUSEDK_STATIC)
#define FUSEDK_DEF static
#elif defined(_WIN32) && defined(FUSEDK_BUILD_DLL)
#define FUSEDK_DEF __declspec(dllexport)
#elif defined(__GNUC__)
#define FUSEDK_DEF __attribute__((visibility("default")))
#else
#define FUSEDK_DEF
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The section between the CDEF markers is read by the Python bindings as their cffi cdef:
   plain declarations only, no preprocessor conditionals. */
/* FUSEDK_CDEF_BEGIN */

struct CUstream_st; /* cudaStream_t without a CUDA include */

/* Status codes. Values are fixed; new codes are only ever appended. */
typedef enum fusedk_status {
  FUSEDK_OK = 0,
  FUSEDK_ERR_INVALID_ARGUMENT = 1, /* a NULL where a tensor is required, a bad flag or eps   */
  FUSEDK_ERR_SHAPE = 2,            /* ndim or a dim size does not match                       */
  FUSEDK_ERR_DTYPE = 3,            /* unsupported dtype, or dtypes of one call differ         */
  FUSEDK_ERR_DEVICE = 4,           /* tensors on different devices, or an unknown device type */
  FUSEDK_ERR_LAYOUT = 5,           /* strides or alignment the op cannot honour               */
  FUSEDK_ERR_UNSUPPORTED = 6,      /* a valid request this build or device does not support   */
  FUSEDK_ERR_NO_CUDA = 7,          /* CUDA tensors, but the GPU half is not compiled in       */
  FUSEDK_ERR_CUDA = 8,             /* the CUDA runtime reported an error                      */
  FUSEDK_ERR_CUBLAS = 9,           /* cuBLASLt reported an error                              */
  FUSEDK_ERR_OUT_OF_MEMORY = 10    /* an allocation failed                                    */
} fusedk_status;

/* DLPack device types (DLDeviceType values). */
typedef enum fusedk_device_type {
  FUSEDK_DEVICE_CPU = 1,
  FUSEDK_DEVICE_CUDA = 2,
  FUSEDK_DEVICE_CUDA_HOST = 3,   /* pinned host memory: runs the CPU reference */
  FUSEDK_DEVICE_CUDA_MANAGED = 13
} fusedk_device_type;

/* DLPack dtype codes (DLDataTypeCode values). */
typedef enum fusedk_dtype_code {
  FUSEDK_DTYPE_INT = 0,
  FUSEDK_DTYPE_UINT = 1,
  FUSEDK_DTYPE_FLOAT = 2,
  FUSEDK_DTYPE_BFLOAT = 4
} fusedk_dtype_code;

/* The three element types fusedk computes on. */
typedef enum fusedk_scalar {
  FUSEDK_F32 = 0,
  FUSEDK_F16 = 1,
  FUSEDK_BF16 = 2
} fusedk_scalar;

/* Normalization kind (adaln). */
typedef enum fusedk_norm {
  FUSEDK_NORM_LAYER = 0,
  FUSEDK_NORM_RMS = 1
} fusedk_norm;

typedef struct fusedk_device {  /* = DLDevice */
  int32_t device_type;          /* fusedk_device_type */
  int32_t device_id;            /* CUDA ordinal; 0 for CPU */
} fusedk_device;

typedef struct fusedk_dtype {   /* = DLDataType */
  uint8_t code;                 /* fusedk_dtype_code */
  uint8_t bits;                 /* 32 or 16 */
  uint16_t lanes;               /* 1 */
} fusedk_dtype;

typedef struct fusedk_tensor {  /* = DLTensor, 48 bytes on 64-bit targets */
  void *data;                   /* base pointer (host or device); element 0 is at data+byte_offset */
  fusedk_device device;
  int32_t ndim;
  fusedk_dtype dtype;
  int64_t *shape;               /* ndim sizes */
  int64_t *strides;             /* ndim strides in ELEMENTS, or NULL for compact row-major */
  uint64_t byte_offset;
} fusedk_tensor;

/* DLPack managed tensors, for handing fusedk-allocated memory to frameworks (= DLManagedTensor,
   DLManagedTensorVersioned). */
typedef struct fusedk_dlmanaged {
  fusedk_tensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct fusedk_dlmanaged *self);
} fusedk_dlmanaged;

typedef struct fusedk_dlmanaged_versioned {
  uint32_t version_major;       /* DLPackVersion {major, minor} */
  uint32_t version_minor;
  void *manager_ctx;
  void (*deleter)(struct fusedk_dlmanaged_versioned *self);
  uint64_t flags;
  fusedk_tensor dl_tensor;
} fusedk_dlmanaged_versioned;

/* One allocation exportable either way: export &legacy ("dltensor") or &versioned
   ("dltensor_versioned"), never both; either deleter frees the data and this block. */
typedef struct fusedk_dlpack {
  fusedk_dlmanaged legacy;
  fusedk_dlmanaged_versioned versioned;
  int64_t shape[8];
  int64_t strides[8];
  struct CUstream_st *stream;   /* device memory is allocated and freed stream-ordered on it */
} fusedk_dlpack;

/* ---- [api] library ---- */
FUSEDK_DEF const char *fusedk_version(void);               /* "MAJOR.MINOR.PATCH" */
FUSEDK_DEF const char *fusedk_status_name(fusedk_status s); /* "FUSEDK_ERR_SHAPE", ... */
FUSEDK_DEF const char *fusedk_failure_reason(void);         /* this thread's last failure, "" if none */
/* JSON: version, build (cuda, archs, cublasLt), devices, ops and their dtypes. Writes at most
   size bytes (NUL-terminated); returns the length it needed (excluding the NUL). */
FUSEDK_DEF size_t fusedk_kernel_info(char *buf, size_t size);
FUSEDK_DEF int fusedk_cuda_device_count(void);              /* 0 without the GPU half or a GPU */

/* ---- [api] describing plain buffers: fusedk_tensor_cpu(p, FUSEDK_BF16, 2, shape) ---- */
FUSEDK_DEF fusedk_dtype fusedk_dtype_of(fusedk_scalar s);
FUSEDK_DEF fusedk_tensor fusedk_tensor_cpu(void *data, fusedk_scalar s, int32_t ndim, int64_t *shape);
FUSEDK_DEF fusedk_tensor fusedk_tensor_cuda(void *data, fusedk_scalar s, int32_t ndim, int64_t *shape,
                                            int32_t device_id);

/* ---- [dlpack] memory and streams, for bindings (DLPack producers) ---- */
/* A compact tensor on `device`, owned by *out until exported. CPU: malloc. CUDA: cudaMallocAsync on
   `stream`, and the deleter frees it with cudaFreeAsync on the same stream (no device-wide sync):
   a consumer using it on another stream orders its last use before the release, as DLPack asks. */
FUSEDK_DEF fusedk_status fusedk_dlpack_alloc(fusedk_device device, fusedk_dtype dtype, int32_t ndim,
                                             const int64_t *shape, struct CUstream_st *stream,
                                             fusedk_dlpack **out);
FUSEDK_DEF void fusedk_dlpack_free(fusedk_dlpack *h);      /* for a never-exported allocation */
/* Make work queued on `producer` visible to `consumer` (event record + wait); no-op if equal. */
FUSEDK_DEF fusedk_status fusedk_stream_wait(int32_t device_id, struct CUstream_st *producer,
                                            struct CUstream_st *consumer);

/* ---- [norm] normalization family (outputs first, stream last) ---- */

/* y = r * rsqrt(mean(r^2) + eps) * weight, r = x + residual. residual, residual_out, weight may be
   NULL; residual_out (the un-normalized sum, as the next block's residual) needs residual.
   The sum is normalized before rounding (as FlashInfer and vLLM do). */
FUSEDK_DEF fusedk_status fusedk_rmsnorm(const fusedk_tensor *y, const fusedk_tensor *residual_out,
                                        const fusedk_tensor *x, const fusedk_tensor *residual,
                                        const fusedk_tensor *weight, float eps,
                                        struct CUstream_st *stream);

/* y = (x - mean) * rsqrt(var + eps) * weight + bias, biased variance; weight, bias may be NULL. */
FUSEDK_DEF fusedk_status fusedk_layernorm(const fusedk_tensor *y, const fusedk_tensor *x,
                                          const fusedk_tensor *weight, const fusedk_tensor *bias,
                                          float eps, struct CUstream_st *stream);

/* y[B,L,D] = norm(x) * (1 + scale[b]) + shift[b]; scale, shift are [B,D] with any row stride
   (0 broadcasts); norm = FUSEDK_NORM_LAYER (weight, bias) or FUSEDK_NORM_RMS (weight; bias must
   be NULL). */
FUSEDK_DEF fusedk_status fusedk_adaln(const fusedk_tensor *y, const fusedk_tensor *x,
                                      const fusedk_tensor *scale, const fusedk_tensor *shift,
                                      fusedk_norm norm, const fusedk_tensor *weight,
                                      const fusedk_tensor *bias, float eps,
                                      struct CUstream_st *stream);

/* Mochi: y[B,L,D] = x + cast(x_res * rsqrt(mean(x_res^2) + eps) * tanh(gate[b])), gate [B,D].
   exact = 1: PyTorch's rounding points; exact = 0: one rounding. */
FUSEDK_DEF fusedk_status fusedk_residual_tanh_gated_rmsnorm(const fusedk_tensor *y,
                                                            const fusedk_tensor *x,
                                                            const fusedk_tensor *x_res,
                                                            const fusedk_tensor *gate, float eps,
                                                            int exact, struct CUstream_st *stream);

/* ---- [elementwise] activations and fused residuals (outputs first, stream last) ----
   Rows of D elements like the norms: any leading dims (gated_residual: [B, L, D]), contiguous last
   dim, inputs may broadcast through stride 0, float32 math, one rounding. */
typedef enum fusedk_activation {
  FUSEDK_ACT_GELU = 0,          /* x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))                  */
  FUSEDK_ACT_GELU_TANH = 1,     /* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))           */
  FUSEDK_ACT_SILU = 2,          /* x * sigmoid(x)                                              */
  FUSEDK_ACT_RELU = 3           /* max(x, 0); NaN stays NaN                                    */
} fusedk_activation;

/* y = act(x) */
FUSEDK_DEF fusedk_status fusedk_act(const fusedk_tensor *y, const fusedk_tensor *x, fusedk_activation kind,
                                    struct CUstream_st *stream);

/* y = silu(a + b * c); a, b, c and y share one shape */
FUSEDK_DEF fusedk_status fusedk_silu_fma(const fusedk_tensor *y, const fusedk_tensor *a, const fusedk_tensor *b,
                                         const fusedk_tensor *c, struct CUstream_st *stream);

/* out[B,L,D] = x + gate[b] * y; gate [B, D] with any row stride (a chunk of an AdaLN-Zero
   modulation; 0 broadcasts) */
FUSEDK_DEF fusedk_status fusedk_gated_residual(const fusedk_tensor *out, const fusedk_tensor *x,
                                               const fusedk_tensor *y, const fusedk_tensor *gate,
                                               struct CUstream_st *stream);

/* Gated linear units. glu: x[..., 2H] -> y[..., H], y = act(a) * b where a is the half named by
   act_half (FUSEDK_GLU_FIRST: x[..., :H], FUSEDK_GLU_SECOND: x[..., H:]) and b the other half.
   SwiGLU (TE, Liger, Mochi) = (SILU, FIRST); diffusers' GEGLU = (GELU, SECOND).
   glu_pair: y = value * act(gate), one shape (e.g. two strided views of one projection). */
typedef enum fusedk_glu_half { FUSEDK_GLU_FIRST = 0, FUSEDK_GLU_SECOND = 1 } fusedk_glu_half;
FUSEDK_DEF fusedk_status fusedk_glu(const fusedk_tensor *y, const fusedk_tensor *x, fusedk_activation act,
                                    fusedk_glu_half act_half, struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_glu_pair(const fusedk_tensor *y, const fusedk_tensor *value,
                                         const fusedk_tensor *gate, fusedk_activation act,
                                         struct CUstream_st *stream);

/* ---- [registry] every op's tensors and attributes, for bindings (Python, XLA FFI) ----
   fusedk_op_call(i, tensors, attrs, stream) runs op i with its tensors in the order of
   fusedk_op_get(i)->tensors (= the C function's argument order; NULL = an absent optional one)
   and its attributes as doubles. Outputs name the input whose shape, dtype and device they take
   (`like`); an optional output exists exactly when the optional input `when` is given. */
typedef enum fusedk_op_id {
  FUSEDK_OP_RMSNORM = 0,
  FUSEDK_OP_LAYERNORM = 1,
  FUSEDK_OP_ADALN = 2,
  FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM = 3,
  FUSEDK_OP_ACT = 4,
  FUSEDK_OP_SILU_FMA = 5,
  FUSEDK_OP_GATED_RESIDUAL = 6,
  FUSEDK_OP_GLU = 7,
  FUSEDK_OP_GLU_PAIR = 8
} fusedk_op_id;                 /* new ops go at the end: the ids are ABI */
#define FUSEDK_OP_COUNT 9
#define FUSEDK_OP_MAX_TENSORS 8
#define FUSEDK_OP_MAX_ATTRS 4

typedef enum fusedk_arg_kind {
  FUSEDK_ARG_IN = 0,
  FUSEDK_ARG_IN_OPT = 1,
  FUSEDK_ARG_OUT = 2,
  FUSEDK_ARG_OUT_OPT = 3
} fusedk_arg_kind;

/* How an argument's shape relates to the op's reference tensor: the first ROW input (x; the
   error messages name it). Leading dims of the ROW tensors flatten jointly into rows. */
typedef enum fusedk_arg_role {
  FUSEDK_ROLE_ROW = 0,          /* the reference's shape [..., D] */
  FUSEDK_ROLE_COLUMN = 1,       /* [D], contiguous: a per-column operand (weight, bias) */
  FUSEDK_ROLE_SAMPLE = 2,       /* [B, D] of a [B, L, D] op, any row stride (0 broadcasts) */
  FUSEDK_ROLE_ROW_HALF = 3      /* the reference's leading dims, half its last dim [..., D/2] */
} fusedk_arg_role;

typedef enum fusedk_attr_type {
  FUSEDK_ATTR_F32 = 0,          /* a float (eps) */
  FUSEDK_ATTR_I32 = 1           /* an int, flag or enum (norm, exact) */
} fusedk_attr_type;

typedef struct fusedk_op_tensor {
  const char *name;
  int32_t kind;                 /* fusedk_arg_kind */
  int32_t like;                 /* outputs: the input they copy shape/dtype/device from; else -1 */
  int32_t when;                 /* FUSEDK_ARG_OUT_OPT: the optional input that makes it exist; else -1 */
  int32_t role;                 /* fusedk_arg_role */
} fusedk_op_tensor;

typedef struct fusedk_op_attr {
  const char *name;
  int32_t type;                 /* fusedk_attr_type */
  double value;                 /* the default */
} fusedk_op_attr;

typedef struct fusedk_op {
  const char *name;             /* the C function without its fusedk_ prefix */
  int32_t n_tensors;
  int32_t n_attrs;
  int32_t row_ndim;             /* 0: rows of any rank [..., D]; 3: exactly [B, L, D] */
  fusedk_op_tensor tensors[8];  /* FUSEDK_OP_MAX_TENSORS */
  fusedk_op_attr attrs[4];      /* FUSEDK_OP_MAX_ATTRS */
} fusedk_op;

FUSEDK_DEF const fusedk_op *fusedk_op_get(int32_t i);        /* NULL unless 0 <= i < FUSEDK_OP_COUNT */
FUSEDK_DEF int32_t fusedk_op_find(const char *name);         /* -1 if no op has that name */
FUSEDK_DEF fusedk_status fusedk_op_call(int32_t i, const fusedk_tensor *const *tensors, const double *attrs,
                                        struct CUstream_st *stream);

/* FUSEDK_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* FUSEDK_H */

/* ===========================================================================================
   Internal interface between the header's implementation and fusedk_kernels.cu. Not API.
   =========================================================================================== */
#if (defined(FUSEDK_IMPLEMENTATION) || defined(FUSEDK__INTERNAL)) && !defined(FUSEDK__INTERNAL_H)
#define FUSEDK__INTERNAL_H
#ifdef __cplusplus
extern "C" {
#endif

/* A [B, L, ...] operand: element (b, l, d) is at p + b*sb + l*sl + d (elements). Per-sample
   vectors use sl = 0. p == NULL: operand absent. */
typedef struct fusedk__rows {
  void *p;
  int64_t sb, sl;
} fusedk__rows;

/* Every op of the normalization family is this one row op:
     v    = x + res                         (res optional; v written to res_out if given)
     n    = (v - mean) * rsqrt(var + eps)   (mean = 0 and var = mean(v^2) for RMS)
     n    = (n * weight + bias) * (1 + scale) + shift      (each optional)
     n    = n * tanh(gate)                                 (optional)
     y    = base + n                                       (base optional)                  */
typedef struct fusedk__norm_args {
  int32_t op;       /* fusedk_op_id: which kernel variant runs (never inferred from NULLs) */
  int32_t scalar;   /* fusedk_scalar */
  int32_t rms;      /* 1: RMSNorm statistics, 0: LayerNorm */
  int32_t exact;    /* Mochi's PyTorch rounding points (gate and base) */
  float eps;
  int64_t B, L, D;
  fusedk__rows x, res, res_out, y, base;
  fusedk__rows scale, shift, gate;
  const void *weight, *bias; /* [D] contiguous */
} fusedk__norm_args;

/* Every op of the elementwise family: y = f(in[0], in[1], in[2]) per element; in[k].p == NULL:
   absent. gated_residual's gate is in[2] as a per-sample vector (sl = 0). glu and glu_pair run
   as op FUSEDK_OP_GLU: y = act(in[0]) * in[1] (glu: the two halves of x's rows, D = H). */
typedef struct fusedk__ew_args {
  int32_t op;       /* fusedk_op_id */
  int32_t scalar;   /* fusedk_scalar */
  int32_t kind;     /* fusedk_activation (act) */
  int64_t B, L, D;
  fusedk__rows y, in[3];
} fusedk__ew_args;

fusedk_status fusedk__fail(fusedk_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
fusedk_status fusedk__cuda_norm(const fusedk__norm_args *a, const char *op, int32_t device_id,
                                struct CUstream_st *stream);
fusedk_status fusedk__cuda_elementwise(const fusedk__ew_args *a, const char *op, int32_t device_id,
                                       struct CUstream_st *stream);
/* stream-ordered device memory (cudaMallocAsync/cudaFreeAsync on `stream`) */
fusedk_status fusedk__cuda_alloc(int32_t device_id, size_t bytes, struct CUstream_st *stream, void **p);
void fusedk__cuda_free(int32_t device_id, void *p, struct CUstream_st *stream);
fusedk_status fusedk__cuda_stream_wait(int32_t device_id, struct CUstream_st *producer,
                                       struct CUstream_st *consumer);
int fusedk__cuda_device_count(void);
size_t fusedk__cuda_info(char *buf, size_t size); /* JSON fragment: "cuda": {...} */

#ifdef __cplusplus
}
#endif
#endif /* internal interface */

/* ===========================================================================================
   IMPLEMENTATION
   =========================================================================================== */
#if defined(FUSEDK_IMPLEMENTATION) && !defined(FUSEDK__IMPLEMENTED)
#define FUSEDK__IMPLEMENTED

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__cplusplus)
#define FUSEDK__TLS thread_local
#elif defined(_MSC_VER)
#define FUSEDK__TLS __declspec(thread)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define FUSEDK__TLS _Thread_local
#else
#define FUSEDK__TLS __thread
#endif

/* The array sizes of the public structs (plain numbers there: the cffi cdef reads that section)
   against the limits they stand for. */
#define FUSEDK__DLPACK_DIMS (int)(sizeof(((fusedk_dlpack *)0)->shape) / sizeof(int64_t))
#define FUSEDK__ASSERT(name, cond) typedef char fusedk__assert_##name[(cond) ? 1 : -1]
FUSEDK__ASSERT(dlpack_dims, sizeof(((fusedk_dlpack *)0)->shape) / sizeof(int64_t) >= FUSEDK_MAX_DIMS);
FUSEDK__ASSERT(op_tensors, sizeof(((fusedk_op *)0)->tensors) / sizeof(fusedk_op_tensor) == FUSEDK_OP_MAX_TENSORS);
FUSEDK__ASSERT(op_attrs, sizeof(((fusedk_op *)0)->attrs) / sizeof(fusedk_op_attr) == FUSEDK_OP_MAX_ATTRS);

#define FUSEDK__STR2(x) #x
#define FUSEDK__STR(x) FUSEDK__STR2(x)

/* --- [errors] ------------------------------------------------------------------------- */

static FUSEDK__TLS char fusedk__reason[512];

fusedk_status fusedk__fail(fusedk_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fusedk__reason, sizeof fusedk__reason, fmt, ap);
  va_end(ap);
  return s;
}

FUSEDK_DEF const char *fusedk_failure_reason(void) { return fusedk__reason; }

FUSEDK_DEF const char *fusedk_version(void) {
  return FUSEDK__STR(FUSEDK_VERSION_MAJOR) "." FUSEDK__STR(FUSEDK_VERSION_MINOR) "." FUSEDK__STR(
      FUSEDK_VERSION_PATCH);
}

FUSEDK_DEF const char *fusedk_status_name(fusedk_status s) {
  switch (s) {
    case FUSEDK_OK: return "FUSEDK_OK";
    case FUSEDK_ERR_INVALID_ARGUMENT: return "FUSEDK_ERR_INVALID_ARGUMENT";
    case FUSEDK_ERR_SHAPE: return "FUSEDK_ERR_SHAPE";
    case FUSEDK_ERR_DTYPE: return "FUSEDK_ERR_DTYPE";
    case FUSEDK_ERR_DEVICE: return "FUSEDK_ERR_DEVICE";
    case FUSEDK_ERR_LAYOUT: return "FUSEDK_ERR_LAYOUT";
    case FUSEDK_ERR_UNSUPPORTED: return "FUSEDK_ERR_UNSUPPORTED";
    case FUSEDK_ERR_NO_CUDA: return "FUSEDK_ERR_NO_CUDA";
    case FUSEDK_ERR_CUDA: return "FUSEDK_ERR_CUDA";
    case FUSEDK_ERR_CUBLAS: return "FUSEDK_ERR_CUBLAS";
    case FUSEDK_ERR_OUT_OF_MEMORY: return "FUSEDK_ERR_OUT_OF_MEMORY";
  }
  return "FUSEDK_ERR_UNKNOWN";
}

/* Without the GPU half, the internal CUDA entry points answer NO_CUDA. */
#ifndef FUSEDK_CUDA
static fusedk_status fusedk__no_cuda(const char *op) {
  return fusedk__fail(FUSEDK_ERR_NO_CUDA,
                      "%s: CUDA tensors given, but this build has no GPU half: compile fusedk_kernels.cu "
                      "with nvcc, link cudart and cublasLt, and define FUSEDK_CUDA where "
                      "FUSEDK_IMPLEMENTATION is defined", op);
}
fusedk_status fusedk__cuda_norm(const fusedk__norm_args *a, const char *op, int32_t id, struct CUstream_st *s) {
  (void)a, (void)id, (void)s;
  return fusedk__no_cuda(op);
}
fusedk_status fusedk__cuda_elementwise(const fusedk__ew_args *a, const char *op, int32_t id, struct CUstream_st *s) {
  (void)a, (void)id, (void)s;
  return fusedk__no_cuda(op);
}
fusedk_status fusedk__cuda_alloc(int32_t id, size_t bytes, struct CUstream_st *s, void **p) {
  (void)id, (void)bytes, (void)s, (void)p;
  return fusedk__no_cuda("dlpack_alloc");
}
void fusedk__cuda_free(int32_t id, void *p, struct CUstream_st *s) { (void)id, (void)p, (void)s; }
fusedk_status fusedk__cuda_stream_wait(int32_t id, struct CUstream_st *a, struct CUstream_st *b) {
  (void)id, (void)a, (void)b;
  return fusedk__no_cuda("stream_wait");
}
int fusedk__cuda_device_count(void) { return 0; }
size_t fusedk__cuda_info(char *buf, size_t size) {
  return (size_t)snprintf(buf, size, "\"cuda\": {\"built\": false}");
}
#endif

FUSEDK_DEF int fusedk_cuda_device_count(void) { return fusedk__cuda_device_count(); }

/* --- [tensors] dtypes, strides, the per-argument checks --------------------------------- */

FUSEDK_DEF fusedk_dtype fusedk_dtype_of(fusedk_scalar s) {
  fusedk_dtype d;
  d.code = (uint8_t)(s == FUSEDK_BF16 ? FUSEDK_DTYPE_BFLOAT : FUSEDK_DTYPE_FLOAT);
  d.bits = (uint8_t)(s == FUSEDK_F32 ? 32 : 16);
  d.lanes = 1;
  return d;
}

FUSEDK_DEF fusedk_tensor fusedk_tensor_cuda(void *data, fusedk_scalar s, int32_t ndim, int64_t *shape,
                                            int32_t device_id) {
  fusedk_tensor t;
  t.data = data;
  t.device.device_type = FUSEDK_DEVICE_CUDA;
  t.device.device_id = device_id;
  t.ndim = ndim;
  t.dtype = fusedk_dtype_of(s);
  t.shape = shape;
  t.strides = NULL;
  t.byte_offset = 0;
  return t;
}

FUSEDK_DEF fusedk_tensor fusedk_tensor_cpu(void *data, fusedk_scalar s, int32_t ndim, int64_t *shape) {
  fusedk_tensor t = fusedk_tensor_cuda(data, s, ndim, shape, 0);
  t.device.device_type = FUSEDK_DEVICE_CPU;
  return t;
}

/* -1 if the dtype is not one fusedk computes on */
static int fusedk__scalar_of(fusedk_dtype d) {
  if (d.lanes != 1) return -1;
  if (d.code == FUSEDK_DTYPE_FLOAT && d.bits == 32) return FUSEDK_F32;
  if (d.code == FUSEDK_DTYPE_FLOAT && d.bits == 16) return FUSEDK_F16;
  if (d.code == FUSEDK_DTYPE_BFLOAT && d.bits == 16) return FUSEDK_BF16;
  return -1;
}

/* A DLPack dtype by name: float64, int32, uint8, bool, complex64, bfloat16, float16x2, ... */
static const char *fusedk__dtype_str(fusedk_dtype d, char *buf, size_t n) {
  static const char *const kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const char *k = d.code < 7 ? kinds[d.code] : NULL;
  int len = k && d.code == 6 && d.bits == 8 ? snprintf(buf, n, "bool")
            : k ? snprintf(buf, n, "%s%d", k, (int)d.bits)
                : snprintf(buf, n, "(code %d, bits %d)", (int)d.code, (int)d.bits);
  if (d.lanes != 1 && len >= 0 && (size_t)len < n) snprintf(buf + len, n - (size_t)len, "x%d", (int)d.lanes);
  return buf;
}

static size_t fusedk__scalar_size(int s) { return s == FUSEDK_F32 ? 4 : 2; }
static const char *fusedk__scalar_name(int s) {
  return s == FUSEDK_F32 ? "float32" : s == FUSEDK_F16 ? "float16" : "bfloat16";
}

static int fusedk__is_gpu(int32_t device_type) {
  return device_type == FUSEDK_DEVICE_CUDA || device_type == FUSEDK_DEVICE_CUDA_MANAGED;
}

static int64_t fusedk__stride(const fusedk_tensor *t, int i) {
  if (t->strides) return t->strides[i];
  int64_t s = 1;
  for (int j = t->ndim - 1; j > i; --j) s *= t->shape[j];
  return s;
}

static char *fusedk__shape_str(const fusedk_tensor *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && k < n; ++i)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

/* One call's validation context: the op name, the reference tensor (x) and the device. */
typedef struct fusedk__check {
  const char *op;
  const char *ref; /* the reference tensor's name: other tensors take its dtype and device */
  int scalar;
  fusedk_device dev;
} fusedk__check;

/* Checks what every tensor argument needs: present (if required), a supported dtype equal to
   the call's, the call's device, element-aligned data, ndim in range, no negative sizes, and a
   contiguous last dim. Sets *present. */
static fusedk_status fusedk__check_tensor(fusedk__check *c, const fusedk_tensor *t, const char *name,
                                          int required, int *present) {
  *present = t != NULL;
  if (!t) {
    if (required) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is NULL, expected a tensor", c->op, name);
    return FUSEDK_OK;
  }
  if (t->ndim < 1 || t->ndim > FUSEDK_MAX_DIMS)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has ndim %d, expected 1..%d", c->op, name, (int)t->ndim,
                        FUSEDK_MAX_DIMS);
  if (!t->shape) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s has a NULL shape", c->op, name);
  int s = fusedk__scalar_of(t->dtype);
  if (s < 0) {
    char dt[48];
    return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected float32, float16 or bfloat16", c->op, name,
                        fusedk__dtype_str(t->dtype, dt, sizeof dt));
  }
  if (c->scalar < 0) {
    c->scalar = s;
    c->dev = t->device;
    if (!fusedk__is_gpu(t->device.device_type) && t->device.device_type != FUSEDK_DEVICE_CPU &&
        t->device.device_type != FUSEDK_DEVICE_CUDA_HOST)
      return fusedk__fail(FUSEDK_ERR_DEVICE, "%s: %s is on device type %d, expected CPU (1), CUDA (2), "
                          "CUDA host (3) or CUDA managed (13)", c->op, name, (int)t->device.device_type);
  } else {
    if (s != c->scalar)
      return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected %s (the dtype of %s)", c->op, name,
                          fusedk__scalar_name(s), fusedk__scalar_name(c->scalar), c->ref);
    int g0 = fusedk__is_gpu(c->dev.device_type), g1 = fusedk__is_gpu(t->device.device_type);
    int known = g1 || t->device.device_type == FUSEDK_DEVICE_CPU || t->device.device_type == FUSEDK_DEVICE_CUDA_HOST;
    if (!known || g0 != g1 || (g0 && t->device.device_id != c->dev.device_id))
      return fusedk__fail(FUSEDK_ERR_DEVICE, "%s: %s is on device (%d, %d), expected the device of %s (%d, %d)",
                          c->op, name, (int)t->device.device_type, (int)t->device.device_id, c->ref,
                          (int)c->dev.device_type, (int)c->dev.device_id);
  }
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 0)
      return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has negative size %lld in dim %d", c->op, name,
                          (long long)t->shape[i], i);
    n *= t->shape[i];
  }
  if (n > 0 && !t->data) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s has NULL data", c->op, name);
  if (((uintptr_t)t->data + t->byte_offset) % fusedk__scalar_size(s))
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s data+byte_offset is not aligned to its %d-byte elements",
                        c->op, name, (int)fusedk__scalar_size(s));
  int last = t->ndim - 1; /* an empty tensor has no layout (NumPy gives it strides of 0) */
  if (n > 0 && t->shape[last] > 1 && fusedk__stride(t, last) != 1)
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has stride %lld in its last dim, expected 1 (contiguous)",
                        c->op, name, (long long)fusedk__stride(t, last));
  return FUSEDK_OK;
}

static fusedk_status fusedk__check_shape(const fusedk__check *c, const fusedk_tensor *t, const char *name,
                                         int ndim, const int64_t *shape, const char *why) {
  int ok = t->ndim == ndim;
  for (int i = 0; ok && i < ndim; ++i) ok = t->shape[i] == shape[i];
  if (ok) return FUSEDK_OK;
  char got[160], want[160];
  fusedk_tensor w;
  memset(&w, 0, sizeof w);
  w.ndim = ndim;
  w.shape = (int64_t *)shape;
  return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected %s (%s)", c->op, name,
                      fusedk__shape_str(t, got, sizeof got), fusedk__shape_str(&w, want, sizeof want), why);
}

/* An output must not have stride 0 across a dim of size > 1 (rows would race). */
static fusedk_status fusedk__check_output(const fusedk__check *c, const fusedk_tensor *t, const char *name) {
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] == 0) return FUSEDK_OK; /* empty: nothing is written */
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] > 1 && fusedk__stride(t, i) == 0)
      return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: output %s has stride 0 in dim %d (size %lld); outputs "
                          "cannot broadcast", c->op, name, i, (long long)t->shape[i]);
  return FUSEDK_OK;
}

static fusedk_status fusedk__check_eps(const fusedk__check *c, float eps) {
  if (!(eps >= 0.0f) || isinf(eps))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: eps is %g, expected a finite value >= 0", c->op,
                        (double)eps);
  return FUSEDK_OK;
}

static void *fusedk__base(const fusedk_tensor *t) {
  return t ? (void *)((char *)t->data + t->byte_offset) : NULL;
}

/* --- [registry] each op's arguments once (C order, kind, role); [validate] one routine --- */

#define FUSEDK__IN(n, role) {n, FUSEDK_ARG_IN, -1, -1, role}
#define FUSEDK__OPT(n, role) {n, FUSEDK_ARG_IN_OPT, -1, -1, role}
#define FUSEDK__OUT(n, like) {n, FUSEDK_ARG_OUT, like, -1, FUSEDK_ROLE_ROW}
#define FUSEDK__EPS(v) {"eps", FUSEDK_ATTR_F32, v}
#define FUSEDK__NO_ATTR {NULL, 0, 0.0}
#define FUSEDK__ROW FUSEDK_ROLE_ROW
#define FUSEDK__COL FUSEDK_ROLE_COLUMN
#define FUSEDK__SMP FUSEDK_ROLE_SAMPLE
static const fusedk_op fusedk__ops[FUSEDK_OP_COUNT] = {
    {"rmsnorm", 5, 1, 0,
     {FUSEDK__OUT("y", 2), {"residual_out", FUSEDK_ARG_OUT_OPT, 2, 3, FUSEDK__ROW}, FUSEDK__IN("x", FUSEDK__ROW),
      FUSEDK__OPT("residual", FUSEDK__ROW), FUSEDK__OPT("weight", FUSEDK__COL)},
     {FUSEDK__EPS(1e-6)}},
    {"layernorm", 4, 1, 0,
     {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__OPT("weight", FUSEDK__COL),
      FUSEDK__OPT("bias", FUSEDK__COL)},
     {FUSEDK__EPS(1e-5)}},
    {"adaln", 6, 2, 3,
     {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__IN("scale", FUSEDK__SMP),
      FUSEDK__IN("shift", FUSEDK__SMP), FUSEDK__OPT("weight", FUSEDK__COL), FUSEDK__OPT("bias", FUSEDK__COL)},
     {{"norm", FUSEDK_ATTR_I32, FUSEDK_NORM_LAYER}, FUSEDK__EPS(1e-6)}},
    {"residual_tanh_gated_rmsnorm", 4, 2, 3,
     {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__IN("x_res", FUSEDK__ROW),
      FUSEDK__IN("gate", FUSEDK__SMP)},
     {FUSEDK__EPS(1e-6), {"exact", FUSEDK_ATTR_I32, 1}}},
    {"act", 2, 1, 0, {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW)}, {{"kind", FUSEDK_ATTR_I32, FUSEDK_ACT_GELU}}},
    {"silu_fma", 4, 0, 0,
     {FUSEDK__OUT("y", 1), FUSEDK__IN("a", FUSEDK__ROW), FUSEDK__IN("b", FUSEDK__ROW), FUSEDK__IN("c", FUSEDK__ROW)},
     {FUSEDK__NO_ATTR}},
    {"gated_residual", 4, 0, 3,
     {FUSEDK__OUT("out", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__IN("y", FUSEDK__ROW),
      FUSEDK__IN("gate", FUSEDK__SMP)},
     {FUSEDK__NO_ATTR}},
    {"glu", 2, 2, 0, {{"y", FUSEDK_ARG_OUT, 1, -1, FUSEDK_ROLE_ROW_HALF}, FUSEDK__IN("x", FUSEDK__ROW)},
     {{"act", FUSEDK_ATTR_I32, FUSEDK_ACT_SILU}, {"act_half", FUSEDK_ATTR_I32, FUSEDK_GLU_FIRST}}},
    {"glu_pair", 3, 1, 0, {FUSEDK__OUT("y", 1), FUSEDK__IN("value", FUSEDK__ROW), FUSEDK__IN("gate", FUSEDK__ROW)},
     {{"act", FUSEDK_ATTR_I32, FUSEDK_ACT_SILU}}},
};
#undef FUSEDK__IN
#undef FUSEDK__OPT
#undef FUSEDK__OUT
#undef FUSEDK__EPS
#undef FUSEDK__NO_ATTR
#undef FUSEDK__ROW
#undef FUSEDK__COL
#undef FUSEDK__SMP

/* Merges the leading dims of the row tensors (all of shape `ref`) jointly: adjacent dims merge
   where every tensor's strides allow it. Returns the number of levels, outermost first. */
static int fusedk__levels(const fusedk_tensor *ref, int n, const fusedk_tensor *const *ts, int64_t *size,
                          int64_t (*st)[FUSEDK_MAX_DIMS]) {
  int m = 0;
  for (int i = 0; i < ref->ndim - 1; ++i) {
    if (ref->shape[i] == 1) continue; /* size-1 dims carry no stride information */
    int merge = m > 0;
    for (int k = 0; k < n && merge; ++k)
      if (ts[k]) merge = st[k][m - 1] == fusedk__stride(ts[k], i) * ref->shape[i];
    if (!merge) size[m++] = 1;
    size[m - 1] *= ref->shape[i];
    for (int k = 0; k < n; ++k)
      if (ts[k]) st[k][m - 1] = fusedk__stride(ts[k], i);
  }
  return m;
}

/* One validated call, family-neutral: the op, dtype and device (c), the row geometry (B rows of
   L rows of D elements) and each argument by registry index: ROW tensors as [B, L] rows,
   SAMPLE vectors with their row stride (sb), COLUMN vectors as a pointer. r[i].p == NULL: absent. */
typedef struct fusedk__rowset {
  fusedk__check c;
  int64_t B, L, D;
  fusedk__rows r[FUSEDK_OP_MAX_TENSORS];
} fusedk__rowset;

/* Flattens the leading dims of the ROW tensors into [B, L] rows; fails if more than two levels
   remain. */
static fusedk_status fusedk__flatten_rows(const fusedk_op *o, const fusedk_tensor *const *t, int ref,
                                          fusedk__rowset *s) {
  const fusedk_tensor *rows[FUSEDK_OP_MAX_TENSORS] = {0};
  int64_t size[FUSEDK_MAX_DIMS], st[FUSEDK_OP_MAX_TENSORS][FUSEDK_MAX_DIMS];
  for (int k = 0; k < o->n_tensors; ++k)
    rows[k] = o->tensors[k].role == FUSEDK_ROLE_ROW || o->tensors[k].role == FUSEDK_ROLE_ROW_HALF ? t[k] : NULL;
  int m = fusedk__levels(t[ref], o->n_tensors, rows, size, st);
  if (m > 2) {
    char shp[160];
    int who = -1; /* a tensor that cannot flatten on its own, else they cannot jointly */
    for (int k = 0; k < o->n_tensors && who < 0; ++k)
      if (rows[k] && fusedk__levels(t[ref], 1, &rows[k], size, st) > 2) who = k;
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: the leading dims of %s (shape %s) have strides that do not "
                        "flatten to at most two levels of rows; pass views with mergeable leading dims",
                        o->name, who >= 0 ? o->tensors[who].name : "the row tensors jointly",
                        fusedk__shape_str(t[ref], shp, sizeof shp));
  }
  s->B = m == 2 ? size[0] : 1;
  s->L = m >= 1 ? size[m - 1] : 1;
  for (int k = 0; k < o->n_tensors; ++k)
    if (rows[k]) {
      s->r[k].sb = m == 2 ? st[k][0] : 0;
      s->r[k].sl = m >= 1 ? st[k][m - 1] : 0;
    }
  return FUSEDK_OK;
}

/* Checks every argument of op `o` against its registry entry, in one place: presence, dtype and
   device (the reference's), alignment, contiguous last dim, shape by role, outputs that do not
   broadcast, optional outputs only with their input. Fills s. */
static fusedk_status fusedk__validate(const fusedk_op *o, const fusedk_tensor *const *t, fusedk__rowset *s) {
  memset(s, 0, sizeof *s);
  int ref = 0;
  while (ref < o->n_tensors && (o->tensors[ref].role != FUSEDK_ROLE_ROW || o->tensors[ref].kind >= FUSEDK_ARG_OUT))
    ++ref;
  const char *xn = o->tensors[ref].name;
  s->c.op = o->name, s->c.ref = xn, s->c.scalar = -1;
  int present;
  fusedk_status st = fusedk__check_tensor(&s->c, t[ref], xn, 1, &present);
  if (st) return st;
  const fusedk_tensor *x = t[ref];
  if (o->row_ndim && x->ndim != o->row_ndim)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has ndim %d, expected %d ([B, L, D])", o->name, xn, (int)x->ndim,
                        (int)o->row_ndim);
  s->D = x->shape[x->ndim - 1];
  if (s->D < 1) return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has last dim 0, expected >= 1", o->name, xn);
  const int64_t B = x->shape[0], bd[2] = {B, s->D};
  for (int i = 0; i < o->n_tensors; ++i) {
    const fusedk_op_tensor *a = &o->tensors[i];
    if (i != ref) {
      const int required = a->kind == FUSEDK_ARG_IN || a->kind == FUSEDK_ARG_OUT;
      if ((st = fusedk__check_tensor(&s->c, t[i], a->name, required, &present))) return st;
      if (!present) continue;
      if (a->kind == FUSEDK_ARG_OUT_OPT && !t[a->when])
        return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is given but %s is NULL, expected both or neither",
                            o->name, a->name, o->tensors[a->when].name);
      char why[48];
      if (a->role == FUSEDK_ROLE_ROW) {
        snprintf(why, sizeof why, "same as %s", xn);
        st = fusedk__check_shape(&s->c, t[i], a->name, x->ndim, x->shape, why);
      } else if (a->role == FUSEDK_ROLE_ROW_HALF) {
        int64_t half[FUSEDK_MAX_DIMS];
        memcpy(half, x->shape, (size_t)x->ndim * sizeof *half);
        half[x->ndim - 1] = s->D / 2;
        snprintf(why, sizeof why, "%s with half its last dim", xn);
        st = s->D % 2 ? fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has last dim %lld, expected an even size (two "
                                     "halves)", o->name, xn, (long long)s->D)
                      : fusedk__check_shape(&s->c, t[i], a->name, x->ndim, half, why);
      } else if (a->role == FUSEDK_ROLE_COLUMN) {
        snprintf(why, sizeof why, "last dim of %s", xn);
        st = fusedk__check_shape(&s->c, t[i], a->name, 1, bd + 1, why);
      } else {
        snprintf(why, sizeof why, "[B, D] of %s", xn);
        st = fusedk__check_shape(&s->c, t[i], a->name, 2, bd, why);
        s->r[i].sb = fusedk__stride(t[i], 0);
      }
      if (st || (a->kind >= FUSEDK_ARG_OUT && (st = fusedk__check_output(&s->c, t[i], a->name)))) return st;
    }
    s->r[i].p = fusedk__base(t[i]);
  }
  if (o->row_ndim != 3) return fusedk__flatten_rows(o, t, ref, s);
  s->B = B, s->L = x->shape[1]; /* [B, L, D]: B stays, the per-sample vectors index it */
  for (int i = 0; i < o->n_tensors; ++i)
    if (t[i] && (o->tensors[i].role == FUSEDK_ROLE_ROW || o->tensors[i].role == FUSEDK_ROLE_ROW_HALF))
      s->r[i].sb = fusedk__stride(t[i], 0), s->r[i].sl = fusedk__stride(t[i], 1);
  return FUSEDK_OK;
}

/* --- [numerics] conversions with round-to-nearest-even ---------------------------------- */

static float fusedk__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t fusedk__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float fusedk__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) { float f = ldexpf((float)m, -24); return sign ? -f : f; }
  if (e == 31) return fusedk__bits_f32(sign | 0x7f800000u | (m << 13));
  return fusedk__bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static uint16_t fusedk__f32_to_f16(float f) {
  uint32_t x = fusedk__f32_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (ax < 0x38800000u) /* below 2^-14: subnormal, a multiple of 2^-24 */
    return (uint16_t)(sign | (uint32_t)nearbyintf(fusedk__bits_f32(ax) * 16777216.0f));
  ax += 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(sign | ((ax >> 13) - (112u << 10)));
}

static float fusedk__bf16_to_f32(uint16_t h) { return fusedk__bits_f32((uint32_t)h << 16); }

/* v rounded to p significant bits, with subnormals below 2^emin (exact in double). */
static double fusedk__round_prec(double v, int p, int emin) {
  if (v != v || v == 0.0 || isinf(v)) return v;
  int e;
  (void)frexp(v, &e);
  int q = e - p < emin - p + 1 ? emin - p + 1 : e - p;
  return ldexp(nearbyint(ldexp(v, -q)), q);
}

static double fusedk__load(const void *p, int64_t i, int s) {
  if (s == FUSEDK_F32) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return s == FUSEDK_F16 ? fusedk__f16_to_f32(h) : fusedk__bf16_to_f32(h);
}

/* v rounded once to the dtype, as a double */
static double fusedk__round(double v, int s) {
  if (s == FUSEDK_F32) return (float)v;
  if (s == FUSEDK_F16) return fusedk__f16_to_f32(fusedk__f32_to_f16((float)fusedk__round_prec(v, 11, -14)));
  return (float)fusedk__round_prec(v, 8, -126);
}

static void fusedk__store(void *p, int64_t i, double v, int s) {
  if (s == FUSEDK_F32) { ((float *)p)[i] = (float)v; return; }
  if (s == FUSEDK_F16) { ((uint16_t *)p)[i] = fusedk__f32_to_f16((float)fusedk__round_prec(v, 11, -14)); return; }
  if (v != v) { ((uint16_t *)p)[i] = 0x7fc0u; return; }
  ((uint16_t *)p)[i] = (uint16_t)(fusedk__f32_bits((float)fusedk__round_prec(v, 8, -126)) >> 16);
}

/* --- [norm] CPU reference and entry points ---------------------------------------------- */

static void *fusedk__at(const fusedk__rows *r, int64_t b, int64_t l, int s) {
  return (char *)r->p + (b * r->sb + l * r->sl) * (int64_t)fusedk__scalar_size(s);
}

/* 0, or -1 when the row buffer cannot be allocated (nothing written then) */
static int fusedk__norm_cpu(const fusedk__norm_args *a) {
  const int s = a->scalar;
  const int64_t D = a->D;
  double *v = (double *)malloc((size_t)D * sizeof(double));
  if (!v) return -1;
  for (int64_t b = 0; b < a->B; ++b)
    for (int64_t l = 0; l < a->L; ++l) {
      const void *x = fusedk__at(&a->x, b, l, s);
      const void *res = a->res.p ? fusedk__at(&a->res, b, l, s) : NULL;
      double sum = 0.0, mean = 0.0, var = 0.0;
      for (int64_t d = 0; d < D; ++d) {
        v[d] = fusedk__load(x, d, s) + (res ? fusedk__load(res, d, s) : 0.0);
        sum += a->rms ? v[d] * v[d] : v[d];
      }
      if (a->rms) {
        var = sum / (double)D;
      } else {
        mean = sum / (double)D;
        for (int64_t d = 0; d < D; ++d) var += (v[d] - mean) * (v[d] - mean);
        var /= (double)D;
      }
      const double rstd = 1.0 / sqrt(var + (double)a->eps);
      /* exact (Mochi) mode: PyTorch's float32 rstd = rsqrt(float(mean(x^2)) + eps) */
      const float rstd_f = (float)(1.0 / sqrt((double)((float)var + a->eps)));
      void *y = fusedk__at(&a->y, b, l, s);
      void *ro = a->res_out.p ? fusedk__at(&a->res_out, b, l, s) : NULL;
      const void *base = a->base.p ? fusedk__at(&a->base, b, l, s) : NULL;
      const void *sc = a->scale.p ? fusedk__at(&a->scale, b, 0, s) : NULL;
      const void *sh = a->shift.p ? fusedk__at(&a->shift, b, 0, s) : NULL;
      const void *g = a->gate.p ? fusedk__at(&a->gate, b, 0, s) : NULL;
      for (int64_t d = 0; d < D; ++d) {
        double n = (v[d] - mean) * rstd;
        if (a->weight) n *= fusedk__load(a->weight, d, s);
        if (a->bias) n += fusedk__load(a->bias, d, s);
        if (sc) n *= 1.0 + fusedk__load(sc, d, s);
        if (sh) n += fusedk__load(sh, d, s);
        if (a->exact) { /* Mochi's rounding points: (x_res*rstd)*tanh(g) in float32, cast, add */
          float tg = g ? (float)fusedk__round(tanh(fusedk__load(g, d, s)), s) : 1.0f;
          float nf = ((float)v[d] * rstd_f) * tg;
          float sum_f = (float)(base ? fusedk__load(base, d, s) : 0.0) + (float)fusedk__round(nf, s);
          n = sum_f;
        } else {
          if (g) n *= tanh(fusedk__load(g, d, s));
          if (base) n += fusedk__load(base, d, s);
        }
        if (ro) fusedk__store(ro, d, v[d], s);
        fusedk__store(y, d, n, s);
      }
    }
  free(v);
  return 0;
}

/* Runs a validated op where its tensors live. */
static fusedk_status fusedk__norm_run(const fusedk__check *c, fusedk__norm_args *a, struct CUstream_st *stream) {
  if (a->B * a->L == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(c->dev.device_type)) return fusedk__cuda_norm(a, c->op, c->dev.device_id, stream);
  if (fusedk__norm_cpu(a))
    return fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate a row of %lld doubles", c->op,
                        (long long)a->D);
  return FUSEDK_OK;
}

/* The norm arguments of a validated call of registry op `op`. */
static fusedk__norm_args fusedk__norm_of(const fusedk__rowset *s, int op, float eps) {
  fusedk__norm_args a;
  memset(&a, 0, sizeof a);
  a.op = op, a.scalar = s->c.scalar, a.eps = eps;
  a.B = s->B, a.L = s->L, a.D = s->D;
  return a;
}

FUSEDK_DEF fusedk_status fusedk_rmsnorm(const fusedk_tensor *y, const fusedk_tensor *residual_out,
                                        const fusedk_tensor *x, const fusedk_tensor *residual,
                                        const fusedk_tensor *weight, float eps, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, residual_out, x, residual, weight};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(&fusedk__ops[FUSEDK_OP_RMSNORM], t, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  fusedk__norm_args a = fusedk__norm_of(&s, FUSEDK_OP_RMSNORM, eps);
  a.y = s.r[0], a.res_out = s.r[1], a.x = s.r[2], a.res = s.r[3], a.weight = s.r[4].p;
  a.rms = 1;
  return fusedk__norm_run(&s.c, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_layernorm(const fusedk_tensor *y, const fusedk_tensor *x,
                                          const fusedk_tensor *weight, const fusedk_tensor *bias, float eps,
                                          struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x, weight, bias};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(&fusedk__ops[FUSEDK_OP_LAYERNORM], t, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  fusedk__norm_args a = fusedk__norm_of(&s, FUSEDK_OP_LAYERNORM, eps);
  a.y = s.r[0], a.x = s.r[1], a.weight = s.r[2].p, a.bias = s.r[3].p;
  return fusedk__norm_run(&s.c, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_adaln(const fusedk_tensor *y, const fusedk_tensor *x, const fusedk_tensor *scale,
                                      const fusedk_tensor *shift, fusedk_norm norm, const fusedk_tensor *weight,
                                      const fusedk_tensor *bias, float eps, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x, scale, shift, weight, bias};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(&fusedk__ops[FUSEDK_OP_ADALN], t, &s);
  if (st) return st;
  if (norm != FUSEDK_NORM_LAYER && norm != FUSEDK_NORM_RMS)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "adaln: norm is %d, expected FUSEDK_NORM_LAYER (0) or "
                        "FUSEDK_NORM_RMS (1)", (int)norm);
  if (bias && norm == FUSEDK_NORM_RMS)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "adaln: bias is given with FUSEDK_NORM_RMS, expected NULL "
                        "(RMSNorm has no bias)");
  if ((st = fusedk__check_eps(&s.c, eps))) return st;
  fusedk__norm_args a = fusedk__norm_of(&s, FUSEDK_OP_ADALN, eps);
  a.y = s.r[0], a.x = s.r[1], a.scale = s.r[2], a.shift = s.r[3], a.weight = s.r[4].p, a.bias = s.r[5].p;
  a.rms = norm == FUSEDK_NORM_RMS;
  return fusedk__norm_run(&s.c, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_residual_tanh_gated_rmsnorm(const fusedk_tensor *y, const fusedk_tensor *x,
                                                            const fusedk_tensor *x_res, const fusedk_tensor *gate,
                                                            float eps, int exact, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x, x_res, gate};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(&fusedk__ops[FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM], t, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  if (exact != 0 && exact != 1)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "residual_tanh_gated_rmsnorm: exact is %d, expected 0 or 1",
                        exact);
  fusedk__norm_args a = fusedk__norm_of(&s, FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM, eps);
  a.y = s.r[0], a.base = s.r[1], a.x = s.r[2], a.gate = s.r[3]; /* x_res is normalized, x added after */
  a.rms = 1;
  a.exact = exact;
  return fusedk__norm_run(&s.c, &a, stream);
}

/* --- [elementwise] CPU reference and entry points ---------------------------------------- */

static double fusedk__act_f64(double v, int kind) {
  switch (kind) {
    case FUSEDK_ACT_GELU: return 0.5 * v * (1.0 + erf(v * 0.70710678118654752));
    case FUSEDK_ACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(0.79788456080286536 * (v + 0.044715 * v * v * v)));
    case FUSEDK_ACT_SILU: return v / (1.0 + exp(-v));
    default: return v > 0.0 ? v : v == v ? 0.0 : v; /* relu; NaN stays NaN */
  }
}

static void fusedk__elementwise_cpu(const fusedk__ew_args *a) {
  const int s = a->scalar;
  for (int64_t b = 0; b < a->B; ++b)
    for (int64_t l = 0; l < a->L; ++l) {
      const void *p[3] = {NULL, NULL, NULL};
      for (int k = 0; k < 3; ++k)
        if (a->in[k].p) p[k] = fusedk__at(&a->in[k], b, l, s);
      void *y = fusedk__at(&a->y, b, l, s);
      for (int64_t d = 0; d < a->D; ++d) {
        const double v = fusedk__load(p[0], d, s);
        double r;
        if (a->op == FUSEDK_OP_ACT) r = fusedk__act_f64(v, a->kind);
        else if (a->op == FUSEDK_OP_SILU_FMA) r = fusedk__act_f64(v + fusedk__load(p[1], d, s) * fusedk__load(p[2], d, s), FUSEDK_ACT_SILU);
        else if (a->op == FUSEDK_OP_GLU) r = fusedk__act_f64(v, a->kind) * fusedk__load(p[1], d, s);
        else r = v + fusedk__load(p[2], d, s) * fusedk__load(p[1], d, s); /* gated_residual */
        fusedk__store(y, d, r, s);
      }
    }
}

/* Validates registry op `op`'s tensors t (output first) into the arguments of kernel variant
   kop: y = the output, in[k] = the k-th input. */
static fusedk_status fusedk__ew_args_of(int op, const fusedk_tensor *const *t, int kop, int kind, fusedk__ew_args *a,
                                        fusedk__rowset *s) {
  const fusedk_op *o = &fusedk__ops[op];
  fusedk_status st = fusedk__validate(o, t, s);
  if (st) return st;
  memset(a, 0, sizeof *a);
  a->op = kop, a->scalar = s->c.scalar, a->kind = kind;
  a->B = s->B, a->L = s->L, a->D = s->D;
  a->y = s->r[0];
  for (int k = 1; k < o->n_tensors; ++k) a->in[k - 1] = s->r[k];
  return FUSEDK_OK;
}

/* Runs validated elementwise arguments where the tensors live. */
static fusedk_status fusedk__ew_run(const fusedk__ew_args *a, const fusedk__rowset *s, struct CUstream_st *stream) {
  if (a->B * a->L == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s->c.dev.device_type)) return fusedk__cuda_elementwise(a, s->c.op, s->c.dev.device_id, stream);
  fusedk__elementwise_cpu(a);
  return FUSEDK_OK;
}

static fusedk_status fusedk__elementwise(int op, const fusedk_tensor *const *t, int kind, struct CUstream_st *stream) {
  fusedk__ew_args a;
  fusedk__rowset s;
  fusedk_status st = fusedk__ew_args_of(op, t, op, kind, &a, &s);
  return st ? st : fusedk__ew_run(&a, &s, stream);
}

static fusedk_status fusedk__check_act(const char *op, const char *name, int kind) {
  if (kind < FUSEDK_ACT_GELU || kind > FUSEDK_ACT_RELU)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is %d, expected FUSEDK_ACT_GELU (0), GELU_TANH (1), "
                        "SILU (2) or RELU (3)", op, name, kind);
  return FUSEDK_OK;
}

/* glu (x split in halves) and glu_pair (value, gate): y = act(a) * b as one FUSEDK_OP_GLU run. */
static fusedk_status fusedk__glu(int op, const fusedk_tensor *const *t, int act, int act_half,
                                 struct CUstream_st *stream) {
  const fusedk_op *o = &fusedk__ops[op];
  fusedk_status st = fusedk__check_act(o->name, "act", act);
  if (st) return st;
  if (act_half != FUSEDK_GLU_FIRST && act_half != FUSEDK_GLU_SECOND)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "glu: act_half is %d, expected FUSEDK_GLU_FIRST (0) or "
                        "FUSEDK_GLU_SECOND (1)", act_half);
  fusedk__ew_args a;
  fusedk__rowset s;
  if ((st = fusedk__ew_args_of(op, t, FUSEDK_OP_GLU, act, &a, &s))) return st;
  if (op == FUSEDK_OP_GLU) { /* the halves of x: same rows, the second H elements further */
    a.D = s.D / 2;
    fusedk__rows h = a.in[0];
    h.p = (char *)h.p + a.D * (int64_t)fusedk__scalar_size(s.c.scalar);
    if (act_half == FUSEDK_GLU_FIRST) a.in[1] = h;
    else a.in[1] = a.in[0], a.in[0] = h;
  } else { /* act(gate) * value */
    const fusedk__rows value = a.in[0];
    a.in[0] = a.in[1], a.in[1] = value;
  }
  return fusedk__ew_run(&a, &s, stream);
}

FUSEDK_DEF fusedk_status fusedk_glu(const fusedk_tensor *y, const fusedk_tensor *x, fusedk_activation act,
                                    fusedk_glu_half act_half, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x};
  return fusedk__glu(FUSEDK_OP_GLU, t, act, act_half, stream);
}

FUSEDK_DEF fusedk_status fusedk_glu_pair(const fusedk_tensor *y, const fusedk_tensor *value,
                                         const fusedk_tensor *gate, fusedk_activation act,
                                         struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, value, gate};
  return fusedk__glu(FUSEDK_OP_GLU_PAIR, t, act, FUSEDK_GLU_FIRST, stream);
}

FUSEDK_DEF fusedk_status fusedk_act(const fusedk_tensor *y, const fusedk_tensor *x, fusedk_activation kind,
                                    struct CUstream_st *stream) {
  fusedk_status st = fusedk__check_act("act", "kind", (int)kind);
  if (st) return st;
  const fusedk_tensor *t[] = {y, x};
  return fusedk__elementwise(FUSEDK_OP_ACT, t, kind, stream);
}

FUSEDK_DEF fusedk_status fusedk_silu_fma(const fusedk_tensor *y, const fusedk_tensor *a, const fusedk_tensor *b,
                                         const fusedk_tensor *c, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, a, b, c};
  return fusedk__elementwise(FUSEDK_OP_SILU_FMA, t, 0, stream);
}

FUSEDK_DEF fusedk_status fusedk_gated_residual(const fusedk_tensor *out, const fusedk_tensor *x,
                                               const fusedk_tensor *y, const fusedk_tensor *gate,
                                               struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {out, x, y, gate};
  return fusedk__elementwise(FUSEDK_OP_GATED_RESIDUAL, t, 0, stream);
}

/* --- [registry] lookup and the generic call ------------------------------------------------ */

FUSEDK_DEF const fusedk_op *fusedk_op_get(int32_t i) {
  return i >= 0 && i < FUSEDK_OP_COUNT ? &fusedk__ops[i] : NULL;
}

FUSEDK_DEF int32_t fusedk_op_find(const char *name) {
  for (int32_t i = 0; name && i < FUSEDK_OP_COUNT; ++i)
    if (!strcmp(fusedk__ops[i].name, name)) return i;
  return -1;
}

FUSEDK_DEF fusedk_status fusedk_op_call(int32_t i, const fusedk_tensor *const *t, const double *a,
                                        struct CUstream_st *s) {
  if (i < 0 || i >= FUSEDK_OP_COUNT)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "op_call: op %d, expected 0..%d", (int)i, FUSEDK_OP_COUNT - 1);
  if (!t || !a) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "op_call: %s: tensors or attrs is NULL", fusedk__ops[i].name);
  for (int k = 0; k < fusedk__ops[i].n_attrs; ++k) /* integer attributes: cast only what is one */
    if (fusedk__ops[i].attrs[k].type == FUSEDK_ATTR_I32 &&
        !(a[k] >= -2147483648.0 && a[k] <= 2147483647.0 && a[k] == floor(a[k])))
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: attribute %s is %g, expected an integer",
                          fusedk__ops[i].name, fusedk__ops[i].attrs[k].name, a[k]);
  switch ((fusedk_op_id)i) {
    case FUSEDK_OP_RMSNORM: return fusedk_rmsnorm(t[0], t[1], t[2], t[3], t[4], (float)a[0], s);
    case FUSEDK_OP_LAYERNORM: return fusedk_layernorm(t[0], t[1], t[2], t[3], (float)a[0], s);
    case FUSEDK_OP_ADALN: return fusedk_adaln(t[0], t[1], t[2], t[3], (fusedk_norm)(int)a[0], t[4], t[5], (float)a[1], s);
    case FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM:
      return fusedk_residual_tanh_gated_rmsnorm(t[0], t[1], t[2], t[3], (float)a[0], (int)a[1], s);
    case FUSEDK_OP_ACT: return fusedk_act(t[0], t[1], (fusedk_activation)(int)a[0], s);
    case FUSEDK_OP_SILU_FMA: return fusedk_silu_fma(t[0], t[1], t[2], t[3], s);
    case FUSEDK_OP_GATED_RESIDUAL: return fusedk_gated_residual(t[0], t[1], t[2], t[3], s);
    case FUSEDK_OP_GLU: return fusedk_glu(t[0], t[1], (fusedk_activation)(int)a[0], (fusedk_glu_half)(int)a[1], s);
    case FUSEDK_OP_GLU_PAIR: return fusedk_glu_pair(t[0], t[1], t[2], (fusedk_activation)(int)a[0], s);
  }
  return FUSEDK_ERR_INVALID_ARGUMENT;
}

/* --- [dlpack] allocations and streams ---------------------------------------------------- */

static void fusedk__dlpack_release(fusedk_dlpack *h) {
  if (!h) return;
  if (fusedk__is_gpu(h->legacy.dl_tensor.device.device_type))
    fusedk__cuda_free(h->legacy.dl_tensor.device.device_id, h->legacy.dl_tensor.data, h->stream);
  else
    free(h->legacy.dl_tensor.data);
  free(h);
}
static void fusedk__dlpack_delete_legacy(fusedk_dlmanaged *m) { fusedk__dlpack_release((fusedk_dlpack *)m->manager_ctx); }
static void fusedk__dlpack_delete_versioned(fusedk_dlmanaged_versioned *m) {
  fusedk__dlpack_release((fusedk_dlpack *)m->manager_ctx);
}

FUSEDK_DEF void fusedk_dlpack_free(fusedk_dlpack *h) { fusedk__dlpack_release(h); }

FUSEDK_DEF fusedk_status fusedk_dlpack_alloc(fusedk_device device, fusedk_dtype dtype, int32_t ndim,
                                             const int64_t *shape, struct CUstream_st *stream,
                                             fusedk_dlpack **out) {
  if (!out) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "dlpack_alloc: out is NULL");
  if (ndim < 0 || ndim > FUSEDK__DLPACK_DIMS || (ndim > 0 && !shape))
    return fusedk__fail(FUSEDK_ERR_SHAPE, "dlpack_alloc: ndim is %d, expected 0..%d with a shape", (int)ndim,
                        FUSEDK__DLPACK_DIMS);
  int s = fusedk__scalar_of(dtype);
  if (s < 0) return fusedk__fail(FUSEDK_ERR_DTYPE, "dlpack_alloc: unsupported dtype");
  size_t n = 1;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0) return fusedk__fail(FUSEDK_ERR_SHAPE, "dlpack_alloc: negative size in dim %d", i);
    n *= (size_t)shape[i];
  }
  fusedk_dlpack *h = (fusedk_dlpack *)calloc(1, sizeof *h);
  if (!h) return fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "dlpack_alloc: cannot allocate the header");
  size_t bytes = n * fusedk__scalar_size(s);
  void *data = NULL;
  if (fusedk__is_gpu(device.device_type)) {
    fusedk_status st = fusedk__cuda_alloc(device.device_id, bytes, stream, &data);
    if (st) { free(h); return st; }
  } else if (device.device_type == FUSEDK_DEVICE_CPU) {
    data = malloc(bytes ? bytes : 1);
    if (!data) { free(h); return fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "dlpack_alloc: cannot allocate %zu bytes", bytes); }
  } else {
    free(h);
    return fusedk__fail(FUSEDK_ERR_DEVICE, "dlpack_alloc: device type %d, expected CPU or CUDA", (int)device.device_type);
  }
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    h->shape[i] = shape[i];
    h->strides[i] = stride;
    stride *= shape[i];
  }
  fusedk_tensor *t = &h->legacy.dl_tensor;
  t->data = data;
  t->device = device;
  t->ndim = ndim;
  t->dtype = dtype;
  t->shape = h->shape;
  t->strides = h->strides; /* DLPack >= 1.2: producers always emit strides */
  t->byte_offset = 0;
  h->versioned.dl_tensor = *t;
  h->stream = stream;
  h->legacy.manager_ctx = h->versioned.manager_ctx = h;
  h->legacy.deleter = fusedk__dlpack_delete_legacy;
  h->versioned.deleter = fusedk__dlpack_delete_versioned;
  h->versioned.version_major = 1;
  h->versioned.version_minor = 0;
  *out = h;
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_stream_wait(int32_t device_id, struct CUstream_st *producer,
                                            struct CUstream_st *consumer) {
  if (producer == consumer) return FUSEDK_OK;
  return fusedk__cuda_stream_wait(device_id, producer, consumer);
}

/* --- [info] kernel_info ------------------------------------------------------------------- */

FUSEDK_DEF size_t fusedk_kernel_info(char *buf, size_t size) {
  char tmp[4096];
  size_t k = (size_t)snprintf(tmp, sizeof tmp, "{\"version\": \"%s\", ", fusedk_version());
  k += fusedk__cuda_info(tmp + k, sizeof tmp - k);
  for (int i = 0; i < FUSEDK_OP_COUNT && k < sizeof tmp; ++i)
    k += (size_t)snprintf(tmp + k, sizeof tmp - k, "%s\"%s\": [\"float32\", \"float16\", \"bfloat16\"]",
                          i ? ", " : ", \"ops\": {", fusedk__ops[i].name);
  if (k < sizeof tmp) k += (size_t)snprintf(tmp + k, sizeof tmp - k, "}}");
  if (buf && size) snprintf(buf, size, "%s", tmp);
  return k;
}

#ifdef __cplusplus
}
#endif
#endif /* FUSEDK_IMPLEMENTATION */
