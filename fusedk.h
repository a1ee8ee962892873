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

     fusedk_rope         q [B,S,Hq,D], k [B,S,Hk,D]: the first R channels of each head rotate,
                         pairs (2i, 2i+1) or (i, i+R/2): a' = a cos - b sin, b' = b cos + a sin,
                         float32 tables cos/sin [S,R/2], [S,H,R/2] or [B,S,H,R/2]
     fusedk_rope_table_1d / _axes (Flux) / _ltx (LTX-Video) / _mixed (Mochi)
                         the float32 (cos, sin) tables of those models (angles in float64)
     fusedk_qk_norm_rope q, k, v of a packed QKV projection -> RMSNorm (per head or over the
                         full H*Dh) and RoPE of q and k, all three written in the attention
                         layout [B,H,S,Dh] or [B,S,H,Dh], one pass
     fusedk_qk_norm_rope_int8   the same with q and k written as scaled int8 tensors, what
                         fusedk_attention_int8_scaled reads (no quantization pass between)
     fusedk_diffusion_step   classifier-free guidance, an Euler (flow matching) or DDIM step,
                         an optional x0 clamp and temporal blend, in one pass

     fusedk_linear       y = act(x w^T + bias) through cuBLASLt's epilogues (aux_out = x w^T + bias)
     fusedk_linear_backward   dx, dw, db of it (dz = dy * act'(aux)), each optional
     fusedk_quantize_fp8 / fusedk_dequantize_fp8   rows to scaled e4m3 tensors (a float32 scale a
                         row: amax / 448) and back
     fusedk_glu_fp8      glu written as a scaled e4m3 tensor (a SwiGLU MLP's hidden state)
     fusedk_linear_fp8   y = act(x w^T + bias) from scaled e4m3 x and w (a scale a row of x and an
                         output channel of w) on FP8 tensor cores, 16-bit y
     fusedk_quantize_int8 / fusedk_linear_w8   weights to scaled int8 (amax / 127.5 a row), and the
                         weight-only GEMM of few rows that reads them (16-bit x, W8A16)

     fusedk_attention    softmax(q k^T * scale) v over [B,S,H,Dh] views: GQA, causal (bottom-right),
                         per-sample kv_len, lse; flash attention on the GPU (Hopper: TMA + wgmma)
     fusedk_attention_int8   the same with q and k quantized to int8 (k smoothed by its mean) and
                         q k^T on integer tensor cores; P V in 16 bits (SageAttention's split)
     fusedk_attention_int8_scaled   its kernel on q and k given as scaled int8 tensors
                         (fusedk_scaled_tensor: int8 data, a float32 scale a row): no quantization pass

     fusedk_lowrank_update   out = beta y + scaling ((x v) * codes) u_t: BEM's generated update, a
                         LoRA's delta; one pass over x and one over y (the [M, r] product stays on chip)
     fusedk_lowrank_prepare / fusedk_linear_lowrank   a LoRA folded into its base linear: w_cat =
                         [w | s b] made once, then y = act(x w^T + bias + s ((x a^T) * codes) b^T)
                         as one GEMM over [x | h]
     fusedk_lowrank_update_backward / fusedk_linear_lowrank_backward   their gradients: dx, dv or
                         da, du_t or db, dcodes (and dbias), the frozen w not differentiated
     fusedk_conv         out = act(conv(x, w) + bias) + residual over NHWC images and NDHWC videos
                         (causal time padding of the video VAEs), an implicit GEMM on tensor cores
     fusedk_fold_batchnorm   BatchNorm's statistics folded into the conv's w and bias (Conv+BN+act
                         is then one conv)
     fusedk_group_norm   channels-last GroupNorm (+ scale/shift, + act: GroupNorm + SiLU in one op)
     fusedk_channel_rmsnorm   the video VAEs' RMSNorm over a pixel's channels, + act

   TENSORS
     fusedk_tensor is layout-identical to DLPack's DLTensor: a DLTensor* from any framework can
     be passed as (const fusedk_tensor *). Strides are in elements, NULL = compact row-major.
     The normalized (last) dim must be contiguous; every other stride is honoured, stride 0
     broadcasts inputs. Outputs may alias an input only exactly (same pointer and strides).
     dtypes: float32, float16, bfloat16; all tensors of one call share x's dtype and device, but
     for those the registry marks float32 (rope's tables, the table builders' tensors), int8 or
     float8 e4m3 (scaled tensors' data), int32 (indices), or the dtype an out_dtype attribute
     names (what an op of 8-bit inputs writes).

   ERRORS
     Every call returns fusedk_status. On failure nothing is launched or written and
     fusedk_failure_reason() (thread-local) names the op, the argument and what was expected.
     The library never prints, exits or aborts.

   STREAMS
     The last argument of every op: a cudaStream_t passed as struct CUstream_st* (NULL = legacy
     default stream). GPU ops are stream-ordered, allocation-free and CUDA-graph capturable (the
     linear ops allocate their workspace and scratch on a stream's first calls: see [linear];
     attention and lowrank_update keep a buffer a stream for some shapes: see theirs).

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
                      [sampler] diffusion_step         [position] rope, its tables, qk_norm_rope
                      [linear] linear, linear_backward (cuBLASLt)   [attention] attention
                      [lowrank] lowrank_update, linear_lowrank, their backward
                      [conv] conv, fold_batchnorm, group_norm, channel_rmsnorm
                      [registry] every op's arguments as data, output shapes
     internal         the argument structs the entry points hand fusedk_kernels.cu, family by
                      family, and its fusedk__cuda_* functions
     implementation   [errors] [tensors] [registry] (each op's entry and output shape rule, lookup,
                      fusedk_op_call) [validate] [numerics]
                      [norm] [elementwise] [sampler] [position] [linear] [attention] [lowrank] [conv]
                      (CPU references and entry points)
                      [dlpack] [info]
     GPU half         fusedk_kernels.cu: [runtime] [dispatch] [numerics] [memory] [reduce] [tile]
                      [norm] [elementwise] (with [sampler]) [position] [gemm] [linear] [attention]
                      [lowrank] [conv] [entry]

   ADDING AN OP
     An fusedk_op_id at the end of the enum, its registry entry (arguments in C order with kind
     and role, attributes with defaults, and the shape rule of its outputs of role OWN, written
     just above the table), its entry point (fusedk__validate, then the op's own checks), its
     CPU reference and its kernel in its family's section; fusedk_op_call's switch.
     kernel_info, the Python functions' registry order, the torch ops and the XLA handlers follow
     the registry.

   VERSIONING
     FUSEDK_VERSION_MAJOR changes when the C ABI or an op's semantics change incompatibly,
     MINOR when ops or arguments are added (enums only grow), PATCH for fixes and speed. While
     MAJOR is 0, a MINOR release may change the ABI: 0.3 added fields to fusedk_op and
     fusedk_op_tensor (argument roles), 0.4 the tensors' fixed dtypes and 8 attributes an op,
     0.5 12 tensors an op (qk_norm_rope takes 10), 0.6 outputs asked for by an attribute
     (when <= -2) and FUSEDK_ACT_NONE, 0.7 int8 arguments (FUSEDK_I8, fusedk_scaled_tensor), 0.8
     int8 outputs (qk_norm_rope_int8), 0.9 float8 e4m3 (FUSEDK_E4M3), row scales
     (FUSEDK_ROLE_ROW_SCALE) and outputs of an attribute's dtype (scalar -3, fusedk_op_out_scalar),
     0.11 int8 weights (quantize_int8, linear_w8), 0.12 conv, fold_batchnorm, group_norm and channel_rmsnorm; rebuild against the header you link.
*/
#ifndef FUSEDK_H
#define FUSEDK_H

#include <stddef.h>
#include <stdint.h>

#define FUSEDK_VERSION_MAJOR 0
#define FUSEDK_VERSION_MINOR 12
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
  FUSEDK_DTYPE_BFLOAT = 4,
  FUSEDK_DTYPE_FLOAT8_E4M3FN = 10 /* kDLFloat8_e4m3fn: no Inf, NaN 0x7f/0xff, +-448 at most */
} fusedk_dtype_code;

/* The three element types fusedk computes on. */
typedef enum fusedk_scalar {
  FUSEDK_F32 = 0,
  FUSEDK_F16 = 1,
  FUSEDK_BF16 = 2,
  FUSEDK_I32 = 3, /* int32: index arguments (attention's kv_len), never computed on */
  FUSEDK_I8 = 4,  /* int8: the data of scaled tensors (fusedk_scaled_tensor), read, never computed on */
  FUSEDK_E4M3 = 5 /* float8 e4m3fn: the data of scaled FP8 tensors, as int8 is */
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

/* A scaled 8-bit tensor: element (..., k) stands for data[..., k] * scale[...], a float32 scale
   a row of the last dim. data: int8 or float8 e4m3 [..., K]; scale: float32 [...] (x's leading
   dims; [1] for a 1-d x). int8 [B, S, H, Dh] with [B, S, H] scales: q and k of attention
   (qk_norm_rope_int8 writes them, attention_int8_scaled reads them); e4m3 [M, K] with [M]: a
   GEMM's operand (quantize_fp8 writes it, linear_fp8 reads it). Any strides, each with a
   contiguous last dim. */
typedef struct fusedk_scaled_tensor {
  const fusedk_tensor *data, *scale;
} fusedk_scaled_tensor;

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
   (0 broadcasts), in x's dtype or both float32 (a modulation a model keeps in float32 beside
   16-bit rows, as Wan: read as float32, no rounding); norm = FUSEDK_NORM_LAYER (weight, bias) or
   FUSEDK_NORM_RMS (weight; bias must be NULL). */
FUSEDK_DEF fusedk_status fusedk_adaln(const fusedk_tensor *y, const fusedk_tensor *x,
                                      const fusedk_tensor *scale, const fusedk_tensor *shift,
                                      fusedk_norm norm, const fusedk_tensor *weight,
                                      const fusedk_tensor *bias, float eps,
                                      struct CUstream_st *stream);

/* FP8 outputs: rmsnorm, layernorm and adaln with y written as a scaled e4m3 tensor (what
   linear_fp8 takes for x): y.data e4m3 like x, y.scale float32 [...] (x's leading dims), each row's
   float32 result quantized as quantize_fp8 quantizes a row (its amax, not that of the result
   rounded to x's dtype: the unfused chain rounds first). One pass over x: the row's values are
   kept in registers between their amax and the quantized stores (rows of up to 32 values a
   thread), else made again from the row the kernel holds. The arguments
   as their 16-bit forms'. CPU: the double result rounded to float32, then quantized; the GPU's
   float32 math may move an element one e4m3 step where a value lies within a rounding of a tie. */
FUSEDK_DEF fusedk_status fusedk_rmsnorm_fp8(const fusedk_scaled_tensor *y, const fusedk_tensor *residual_out,
                                            const fusedk_tensor *x, const fusedk_tensor *residual,
                                            const fusedk_tensor *weight, float eps, struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_layernorm_fp8(const fusedk_scaled_tensor *y, const fusedk_tensor *x,
                                              const fusedk_tensor *weight, const fusedk_tensor *bias, float eps,
                                              struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_adaln_fp8(const fusedk_scaled_tensor *y, const fusedk_tensor *x,
                                          const fusedk_tensor *scale, const fusedk_tensor *shift, fusedk_norm norm,
                                          const fusedk_tensor *weight, const fusedk_tensor *bias, float eps,
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
  FUSEDK_ACT_RELU = 3,          /* max(x, 0); NaN stays NaN                                    */
  FUSEDK_ACT_NONE = 4           /* the identity: linear and linear_backward only               */
} fusedk_activation;

/* y = act(x) */
FUSEDK_DEF fusedk_status fusedk_act(const fusedk_tensor *y, const fusedk_tensor *x, fusedk_activation kind,
                                    struct CUstream_st *stream);

/* y = silu(a + b * c); a, b, c and y share one shape */
FUSEDK_DEF fusedk_status fusedk_silu_fma(const fusedk_tensor *y, const fusedk_tensor *a, const fusedk_tensor *b,
                                         const fusedk_tensor *c, struct CUstream_st *stream);

/* out[B,L,D] = x + gate[b] * y; gate [B, D] with any row stride (a chunk of an AdaLN-Zero
   modulation; 0 broadcasts), in x's dtype or float32 (as adaln's scale and shift) */
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

/* ---- [sampler] one diffusion sampler step over the latent, one read of each input ----
   m  = uncond + guidance * (cond - uncond)   (classifier-free guidance; m = cond without uncond)
   EULER (flow matching; Mochi, LTX-Video, Flux):  x' = x + (sigma_next - sigma) * m
   DDIM (eta = 0, epsilon prediction):  x0 = (x - sqrt(1 - alpha_bar) m) / sqrt(alpha_bar),
        clamped to [-clamp_x0, clamp_x0] when clamp_x0 > 0,
        x' = sqrt(alpha_bar_prev) x0 + sqrt(1 - alpha_bar_prev) m
   then x' = blend x' + (1 - blend) prev when prev is given (a temporal blend).
   x, cond, uncond, prev, out: one shape (inputs may broadcast); out = x updates in place. */
typedef enum fusedk_sampler { FUSEDK_SAMPLER_EULER = 0, FUSEDK_SAMPLER_DDIM = 1 } fusedk_sampler;
typedef struct fusedk_step {
  int32_t sampler;              /* fusedk_sampler */
  float guidance;               /* used with uncond */
  float sigma, sigma_next;      /* EULER */
  float alpha_bar, alpha_bar_prev; /* DDIM: cumulative alpha products, (0, 1] and [0, 1] */
  float clamp_x0;               /* DDIM: > 0 clamps x0, 0 does not */
  float blend;                  /* used with prev */
} fusedk_step;
FUSEDK_DEF fusedk_status fusedk_diffusion_step(const fusedk_tensor *out, const fusedk_tensor *x,
                                               const fusedk_tensor *cond, const fusedk_tensor *uncond,
                                               const fusedk_tensor *prev, const fusedk_step *step,
                                               struct CUstream_st *stream);

/* ---- [position] rotary position embeddings (RoPE) and their tables ----
   rope: q [B, S, Hq, Dh] and k [B, S, Hk, Dh] (any strides but a contiguous last dim) rotated
   in one launch: the first rotary_dim (R) channels of each head turn by the angles of the
   float32 tables cos, sin [S, R/2], [S, H, R/2] or [B, S, H, R/2] (any strides but a
   contiguous last dim, 0 broadcasts;
   H = 1, or Hq = Hk = H); channels >= R pass through. INTERLEAVED rotates the pairs
   (2i, 2i+1) (Flux, LTX-Video, Mochi, GPT-J), HALF the pairs (i, i + R/2) (NeoX, Llama):
     out_a = a cos_i - b sin_i,   out_b = b cos_i + a sin_i
   q_out = q (same pointer and strides) rotates in place. k (and k_out) may be NULL. */
typedef enum fusedk_rope_style { FUSEDK_ROPE_INTERLEAVED = 0, FUSEDK_ROPE_HALF = 1 } fusedk_rope_style;
FUSEDK_DEF fusedk_status fusedk_rope(const fusedk_tensor *q_out, const fusedk_tensor *k_out, const fusedk_tensor *q,
                                     const fusedk_tensor *k, const fusedk_tensor *cos, const fusedk_tensor *sin,
                                     fusedk_rope_style style, int32_t rotary_dim, struct CUstream_st *stream);

/* Table builders: cos, sin float32 (angles in float64, one rounding), inputs float32.
   1d:    positions [S]            -> [S, dim/2],  angle = pos / theta^(2i/dim)
   axes:  ids [S, n], n <= 4       -> [S, sum(axes_dim)/2]: per axis a block of axes_dim[a]/2
          columns, angle = ids[s, a] / theta^(2i/axes_dim[a])                        (Flux)
   ltx:   coords [S, 3] in [0, 1]  -> [S, dim/2]: (dim % 6)/2 leading columns cos 1, sin 0, then
          column f*3 + a: angle = theta^(f/(n-1)) * pi/2 * (2 coords[s, a] - 1), n = dim/6
                                                                                     (LTX-Video)
   mixed: pos [S, 3], freqs [3, H, F] -> [S, H, F], angle = sum_a pos[s, a] freqs[a, h, f]
                                                                                     (Mochi)
   Feed them to fusedk_rope as they are (INTERLEAVED for these models). */
FUSEDK_DEF fusedk_status fusedk_rope_table_1d(const fusedk_tensor *cos, const fusedk_tensor *sin,
                                              const fusedk_tensor *positions, int32_t dim, float theta,
                                              struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_rope_table_axes(const fusedk_tensor *cos, const fusedk_tensor *sin,
                                                const fusedk_tensor *ids, const int32_t *axes_dim, int32_t n_axes,
                                                float theta, struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_rope_table_ltx(const fusedk_tensor *cos, const fusedk_tensor *sin,
                                               const fusedk_tensor *coords, int32_t dim, float theta,
                                               struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_rope_table_mixed(const fusedk_tensor *cos, const fusedk_tensor *sin,
                                                 const fusedk_tensor *pos, const fusedk_tensor *freqs,
                                                 struct CUstream_st *stream);

/* qk_norm_rope: the attention prologue of a DiT in one pass. q [B, S, Hq, Dh], k and v
   [B, S, Hk, Dh] (any strides but a contiguous last dim: e.g. the three views q, k, v =
   qkv.unbind(2) of a packed [B, S, 3, H, Dh] projection) ->
     q', k' = rope(rmsnorm(q) * q_weight), rope(rmsnorm(k) * k_weight),   v' = v,
   written in `layout`: BHSD [B, H, S, Dh] (what SDPA and most attention kernels take) or BSHD
   [B, S, H, Dh] (FlashAttention's), any output strides. norm: HEAD normalizes each head's Dh
   channels (Flux, Mochi, HunyuanVideo; weights [Dh]), FULL the whole H*Dh row of a token
   (LTX-Video, Wan; weights [H*Dh], H*Dh <= 8192), NONE skips it. Weights optional (NULL: 1).
   RoPE as fusedk_rope (style, tables, rotary_dim; channels >= R are normalized, not rotated).
   v and v_out may be NULL. float32 math, one rounding. In place: an output that is exactly its
   input (BSHD, or BHSD through a transposed view of the input). */
typedef enum fusedk_qk_norm { FUSEDK_QK_NORM_HEAD = 0, FUSEDK_QK_NORM_FULL = 1, FUSEDK_QK_NORM_NONE = 2 } fusedk_qk_norm;
typedef enum fusedk_layout { FUSEDK_LAYOUT_BHSD = 0, FUSEDK_LAYOUT_BSHD = 1 } fusedk_layout;
FUSEDK_DEF fusedk_status fusedk_qk_norm_rope(const fusedk_tensor *q_out, const fusedk_tensor *k_out,
                                             const fusedk_tensor *v_out, const fusedk_tensor *q,
                                             const fusedk_tensor *k, const fusedk_tensor *v,
                                             const fusedk_tensor *cos, const fusedk_tensor *sin,
                                             const fusedk_tensor *q_weight, const fusedk_tensor *k_weight,
                                             float eps, fusedk_qk_norm norm, fusedk_rope_style style,
                                             fusedk_layout layout, int32_t rotary_dim, struct CUstream_st *stream);
/* qk_norm_rope_int8: qk_norm_rope with q' and k' written as scaled int8 tensors ([B, S, H, Dh]
   data, float32 [B, S, H] scales, any strides with a contiguous last dim): what
   attention_int8_scaled takes, with no pass between. Each (b, token, head) row of q' and k' is
   quantized as attention_int8 quantizes q: amax its largest magnitude (a NaN wins), data =
   x * (127 / amax) rounded to nearest, ties to even, scale = amax / 127; a row of zeros gives
   data 0 and scale 0, a row with a NaN or Inf data 0 and a non-finite scale (it dequantizes to
   NaN). No mean is taken off k (that needs every key before the first is written): README,
   "8-bit attention", has the error this costs. v has no part here: attention takes the
   projection's v view as it lies. q, k, cos, sin, the weights, eps, norm, style and rotary_dim
   as qk_norm_rope's. CPU: q' and k' in double, rounded to float32, then quantized; the GPU's
   float32 math may move an element one step where x * 127 / amax is within a rounding of a
   half-integer. */
FUSEDK_DEF fusedk_status fusedk_qk_norm_rope_int8(const fusedk_scaled_tensor *q_out, const fusedk_scaled_tensor *k_out,
                                                  const fusedk_tensor *q, const fusedk_tensor *k,
                                                  const fusedk_tensor *cos, const fusedk_tensor *sin,
                                                  const fusedk_tensor *q_weight, const fusedk_tensor *k_weight,
                                                  float eps, fusedk_qk_norm norm, fusedk_rope_style style,
                                                  int32_t rotary_dim, struct CUstream_st *stream);

/* ---- [linear] the matrix family: cuBLASLt GEMMs with fused epilogues ----
   linear:  z = x[..., K] . w[N, K]^T + bias[N],  y[..., N] = act(z)
     x's leading dims are the M rows (they must flatten to one row stride); w and bias as
     nn.Linear keeps them; bias and aux_out may be NULL. f16/bf16 with float32 accumulation;
     float32 in full precision, or through TF32 tensor cores when tf32 = 1.
     NONE, RELU, GELU_TANH: one GEMM, bias and act in cuBLASLt's epilogue (aux_out too for
     GELU_TANH). GELU (erf) and SILU, which cuBLASLt lacks, and RELU with aux_out: the GEMM
     (+ bias) writes z rounded to the dtype, then one fusedk pass applies act; so for GELU and
     SILU y = act(z rounded to the dtype), as the unfused chain computes it. Matrices whose
     rows are not 16-byte aligned (odd N or K, offset views), an unaligned bias, K = 0: the GEMM
     in float32 into scratch, then one fusedk pass adds the bias, applies act and rounds once
     (cuBLASLt's 16-bit outputs for unaligned rows come out several ulps off). A large GEMM's
     (2 M N K >= 1e10) first uncaptured call times cuBLASLt algorithms and keeps the fastest, as
     the environment variable FUSEDK_LINEAR_TUNE, read when a plan is made, says: 1 (default)
     the heuristic's first 8; 2 also each tile of those (and of the plain GEMM's) in every custom
     option and cluster shape (auto, 1x1, 2x1, 1x2, 2x2) cuBLASLt accepts (~100 candidates,
     each timed once a plan); 3 every tile so (~4400: a plan's search takes seconds, and fusedk's
     cuBLASLt state has one lock, so other threads' linear calls, on any device, wait meanwhile);
     0 none (the heuristic's first). bench/lt_search.cu measures what each level finds.
     aux_out = z rounded to the dtype (the pre-activation): what linear_backward needs for
     act != NONE (for RELU, y itself serves as well: relu'(z) = [y > 0]).
   linear_backward: with dz = dy * act'(aux) rounded to the dtype (dz = dy for NONE),
     dx[..., K] = dz . w,   dw[N, K] = dz^T . x,   db[N] = sum over the rows of dz;
     each output optional (NULL: not computed); aux required unless act is NONE. dz is one
     fusedk pass into a per-stream scratch buffer (cuBLASLt's DRELU/DGELU epilogues apply act'
     to a GEMM's output, and dy is an input here); db is summed in a fixed order (bitwise the same
     run to run). dx, dw with unaligned rows: float32 GEMM results converted by a pass.
   Plans (cuBLASLt descriptors and the heuristic's algorithm) are cached per shape, dtype,
   epilogue, leading dims, pointer alignment and device; a 32 MiB workspace per (device,
   stream) is made on its first call there, scratch (the backward's dz, the float32 route)
   grows to the largest call on that stream and is never freed before fusedk_shutdown (graphs
   captured earlier keep using it). A cached call allocates nothing and runs no heuristic, and
   is CUDA-graph capturable. Thread safe (the per-thread default stream counts as one stream a
   thread); at most 64 (device, stream) pairs until fusedk_shutdown(). */
FUSEDK_DEF fusedk_status fusedk_linear(const fusedk_tensor *y, const fusedk_tensor *aux_out, const fusedk_tensor *x,
                                       const fusedk_tensor *w, const fusedk_tensor *bias, fusedk_activation act,
                                       int32_t tf32, struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_linear_backward(const fusedk_tensor *dx, const fusedk_tensor *dw,
                                                const fusedk_tensor *db, const fusedk_tensor *dy,
                                                const fusedk_tensor *x, const fusedk_tensor *w,
                                                const fusedk_tensor *aux, fusedk_activation act, int32_t tf32,
                                                struct CUstream_st *stream);
/* FP8: scaled e4m3 tensors (fusedk_scaled_tensor, data FUSEDK_E4M3) and the GEMM that takes them.
   quantize_fp8: x[..., K] (f32/f16/bf16) -> out.data e4m3 [..., K], out.scale float32 [...] (x's
     leading dims; [1] for a 1-d x), a row at a time, in float32 as the GPU computes it: amax the
     row's largest magnitude (a NaN wins), data = e4m3(x * (448 / amax)) rounded to nearest, ties
     to even, saturating at +-448, scale = amax / 448; where 448 / amax is not finite (a row of
     zeros, amax below 448 / FLT_MAX, a NaN or Inf in the row) data is 0 (NaN where x is NaN or
     Inf) and the scale amax / 448: 0 for zeros, non-finite for a NaN or Inf (the row dequantizes
     to NaN). What torchao's dynamic
     per-row activation scaling (PerRow) computes, in one pass: weights once, activations where no
     op writes them in FP8.
   dequantize_fp8: y[..., K] = data * scale, the product in float32, rounded once to y's dtype
     (f32, f16, bf16: the registry's out_dtype attribute).
   glu_fp8: glu's y = act(one half of x) * the other half (x[..., 2H], act and act_half as glu
     takes them) written as out.data e4m3 [..., H] and out.scale [...], each row quantized as
     quantize_fp8 quantizes one: a SwiGLU MLP's hidden state for its second FP8 GEMM, without the
     16-bit pass between. The values are made in float32 on the GPU and in double on the CPU
     (glu's), so a value at an e4m3 rounding boundary may land a step apart.
   linear_fp8: z = (x.data . w.data^T) * x.scale[m] * w.scale[n] + bias[n], y[..., N] = act(z),
     aux_out = z rounded (optional); x.data [..., K] with scale [...], w.data [N, K] with scale
     [N] (an output channel's: quantize_fp8 of w); y, aux_out and bias f16 or bf16, one dtype;
     K = 0: z = bias (no scale read).
     On the GPU: cuBLASLt's e4m3 GEMM on Hopper's FP8 tensor cores, both scale vectors applied
     in its epilogue (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) with bias and RELU or
     GELU_TANH; GELU and SILU through linear's act pass. fast_accum = 1 (what torchao's FP8
     linear runs): the tensor cores' own accumulator over all of K; 0: its sums promoted to
     float32 every few k-steps (slower; README, "FP8", has what each costs in error and time).
     FP8 plans are tuned as FUSEDK_LINEAR_TUNE=2 at least (cuBLASLt's heuristic offers one
     algorithm for these scales). Where cuBLASLt has no FP8 algorithm (K not a multiple of 16,
     rows or scales not 16-byte aligned, GPUs before sm_89): x and w dequantized to float32 in
     scratch, then linear's exact route (a float32 GEMM, one rounding).
     The scales must be contiguous ([M] and [N] float32 vectors). Plans, workspace, scratch,
     tuning and graph capture as linear's. CPU: double accumulation of the decoded products. */
FUSEDK_DEF fusedk_status fusedk_quantize_fp8(const fusedk_scaled_tensor *out, const fusedk_tensor *x,
                                             struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_dequantize_fp8(const fusedk_tensor *y, const fusedk_scaled_tensor *x,
                                               struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_glu_fp8(const fusedk_scaled_tensor *out, const fusedk_tensor *x, fusedk_activation act,
                                        fusedk_glu_half act_half, struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_linear_fp8(const fusedk_tensor *y, const fusedk_tensor *aux_out,
                                           const fusedk_scaled_tensor *x, const fusedk_scaled_tensor *w,
                                           const fusedk_tensor *bias, fusedk_activation act, int32_t fast_accum,
                                           struct CUstream_st *stream);
/* Weight-only int8 (W8A16): for GEMMs of few rows, a matrix-vector product whose time is the
   weight's bytes, where quantizing x gains no speed and costs error (a DiT's modulation GEMM,
   one row a sample; decoding).
   quantize_int8: x[..., K] (f32/f16/bf16) -> out.data int8 [..., K], out.scale float32 [...], a
     row at a time as quantize_fp8's with 127.5 for 448 (torchao's symmetric int8, what its
     Int8WeightOnlyConfig stores, bit for bit for float32 rows of amax >= 127.5 x float32's
     epsilon; torchao clamps a smaller scale there, and rounds a 16-bit row's scale to its
     dtype): amax the row's largest magnitude (a NaN wins), scale = amax / 127.5, data = x * (1 /
     scale) in float32 rounded to nearest, ties to even, within [-128, 127]; a row of zeros:
     data 0, scale 0; a NaN or Inf in the row: data 0 where x is finite or not, scale
     non-finite. For a weight [N, K], a scale an output channel: its step is
     amax / 127.5 everywhere, where e4m3's is relative (3 bits), so Gaussian-like weights keep
     about 3 times less error in int8, and rows with outliers (amax far above the rest) more.
   linear_w8: z = w.scale[n] * (x . w.data^T)[m, n] + bias[n], y[..., N] = act(z), aux_out = z
     rounded (optional); x [..., K] f32/f16/bf16 with y, aux_out and bias of its dtype; w.data
     int8 [N, K] (any row stride), w.scale float32 [N] contiguous; GELU and SILU act on z
     rounded to y's dtype, as linear's. GPU: each warp streams four weight rows once per four
     rows of x (float32 sums, shuffled across its lanes) into float32 scratch, then linear's
     bias-and-activation pass; its time grows with M / 4 passes over w, so past a few rows
     quantize x and use linear_fp8. CPU: double sums. */
FUSEDK_DEF fusedk_status fusedk_quantize_int8(const fusedk_scaled_tensor *out, const fusedk_tensor *x,
                                              struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_linear_w8(const fusedk_tensor *y, const fusedk_tensor *aux_out, const fusedk_tensor *x,
                                          const fusedk_scaled_tensor *w, const fusedk_tensor *bias,
                                          fusedk_activation act, struct CUstream_st *stream);
/* Frees what the GPU ops keep between calls (cuBLASLt handles, plans, workspaces, scratch,
   linear_lowrank's [x | h] buffers, attention's split buffers, lowrank_update's partial sums).
   Call it with no op in flight and no captured CUDA graph of a linear, linear_lowrank, attention
   or lowrank_update op left to replay (its buffers are gone); later calls make them again. */
FUSEDK_DEF void fusedk_shutdown(void);

/* ---- [attention] softmax attention in one pass over the keys (flash attention) ----
   out[b, i, h] = sum_j p_ij v[b, j, h / G],  p_ij = softmax over j of scale * q[b, i, h] . k[b, j, h / G]
   q [B, Sq, Hq, Dh]; k, v [B, Sk, Hkv, Dh] with Hq = G * Hkv (GQA, MQA); out like q. Any strides
   but a contiguous last dim: [B, S, H, D] tensors, [B, H, S, D] ones through a transposed view,
   q, k, v as views of one packed projection (qk_norm_rope's outputs in either layout). scale 0:
   1/sqrt(Dh). causal: query i sees the keys j <= i + Sk - Sq (aligned bottom-right, as
   FlashAttention). kv_len (int32 [B], optional): the keys j >= kv_len[b] are masked (padded text
   tokens); a value outside [0, Sk] is refused where kv_len is in host memory (CPU, CUDAHost: read
   as the call checks it) and clamps on a CUDA device (checking it there would cost a host sync).
   lse (float32 [B, Hq, Sq], optional): the natural log of
   each row's sum of exp(scores), what sequence-parallel and ring attention merge partial results
   by. A row whose keys are all masked: out 0, lse -inf. CPU: every dtype, double accumulation,
   one rounding; GPU: f16/bf16. On Hopper, a launch without causal or kv_len whose last wave of
   query blocks would leave SMs idle splits those blocks by keys and merges the parts in the same
   launch (in a fixed order: bitwise the same run to run); causal and kv_len launches with more
   query blocks than SMs hand them out by a counter. Both go through a buffer per (device,
   stream) made on first use (8 KB for the counters, 15-36 MB by Dh for a split on an H100; at
   most 64 streams, past them the launches run unsplit, a block a query block) and kept, like
   linear's, until fusedk_shutdown; the call stays CUDA-graph capturable. A captured graph keeps
   the buffer of the stream it was captured on: it must not run at the same time as attention
   calls on that stream or other graphs captured there (torch.cuda.graph captures on one shared
   side stream unless given one), as with linear's cuBLASLt workspaces. */
FUSEDK_DEF fusedk_status fusedk_attention(const fusedk_tensor *out, const fusedk_tensor *lse, const fusedk_tensor *q,
                                          const fusedk_tensor *k, const fusedk_tensor *v, const fusedk_tensor *kv_len,
                                          float scale, int32_t causal, struct CUstream_st *stream);
/* attention_int8: fusedk_attention (the same arguments and rules) with q and k quantized to
   int8 and S = q k^T on integer tensor cores (int32 sums, exact); the softmax weights and v go
   into P V as fusedk_attention's do (P rounded to the inputs' 16-bit type, v as given): the split
   of SageAttention, since 8 bits of P or of v cost more accuracy than its error contract allows.
   The quantization, in float32 as the GPU computes it (round to nearest, ties to even; amax the
   largest magnitude):
     q  per (b, token, head) row: q8 = round(q * (127 / amax)), its scale amax / 127;
     k  the mean over the keys of (b, head) that some row sees (below kv_len[b]) taken off first
        (softmax does not change; lse adds scale * q . mean back), then per row as q, its scale
        cut to 22 significant bits (the kernel's conversion of the int32 sums needs that).
   A NaN or Inf among the keys some row sees spreads further than in fusedk_attention: in k, its
   mean makes every row of (b, head) NaN. The CPU reference quantizes q and k the same way and
   runs fusedk_attention's reference (double) on their dequantized values and v. Errors against
   float64 attention of the unquantized inputs: README, "8-bit attention". GPU: sm_90a (H100,
   H200), f16 and bf16 inputs, Dh 64, 128 and 256; the 8-bit copies (and v's, where TMA cannot
   read v: a base or stride not a 16-byte multiple, a stride 0 or negative) go through a
   per-stream buffer (grown to the largest call and kept until fusedk_shutdown, as attention's
   split buffer, which this op uses too: the same capture rule for both). */
FUSEDK_DEF fusedk_status fusedk_attention_int8(const fusedk_tensor *out, const fusedk_tensor *lse,
                                               const fusedk_tensor *q, const fusedk_tensor *k, const fusedk_tensor *v,
                                               const fusedk_tensor *kv_len, float scale, int32_t causal,
                                               struct CUstream_st *stream);
/* attention_int8_scaled: attention_int8's kernel on q and k quantized already (by the caller or
   a fused producer: no quantization pass): out = softmax(scale dq(q) dq(k)^T) v with dq(x) =
   x.data * |x.scale| (a quantizer's scales are >= 0; a negative one counts as its magnitude),
   k.scale read to 22 significant bits and below 2^104 (the kernel's conversion of the int32
   sums multiplies it by 1.5 2^23); lse that of dq(q) and dq(k). No mean is taken off k. v, out,
   lse, kv_len, scale and causal as fusedk_attention's, v in q's place for the dtype (out's) and
   the device; out [B, Sq, Hq, Dh] as q.data. Failure reasons name the parts as the registry
   does: q, q_scale, k, k_scale. A non-finite scale makes its rows NaN. CPU: dq(q), dq(k) in
   double, then fusedk_attention's reference. GPU: fusedk_attention_int8's kernel (sm_90a; Dh
   64, 128, 256), reading q.data and k.data as they lie (TMA: their bases and their strides over
   b, s and h 16-byte multiples); one pass writes the kernel's scale arrays into attention_int8's
   buffer. */
FUSEDK_DEF fusedk_status fusedk_attention_int8_scaled(const fusedk_tensor *out, const fusedk_tensor *lse,
                                                      const fusedk_scaled_tensor *q, const fusedk_scaled_tensor *k,
                                                      const fusedk_tensor *v, const fusedk_tensor *kv_len,
                                                      float scale, int32_t causal, struct CUstream_st *stream);

/* ---- [lowrank] low-rank updates: BEM's generated update, a LoRA's delta ----
   out = beta * y + scaling * ((x v) * codes) u_t, per row m of x:
   h[m, j] = sum_k x[m, k] v[k, j] (times codes[m, j] when codes is given), out[m, n] = beta y[m, n]
   + scaling sum_j h[m, j] u_t[j, n]. x [..., K1]; v [K1, r] with rank r in 1..128; codes [..., r]
   (x's leading dims, optional); u_t [r, K2] (U pre-transposed, as BEM stores it); y and out
   [..., K2]. y NULL, or beta 0: out = the update alone (y is not read: NaN or Inf there do not
   propagate, as BLAS and torch.addmm treat beta 0). out may be y itself (the same view:
   in place, each element read before it is written); otherwise no output overlaps an input. Rows
   by any stride (leading dims that flatten to one row stride), last dims contiguous. One dtype
   for every tensor. CPU: every dtype, double accumulation, one rounding. GPU: y read once and x
   once, in one kernel, or in two where the rows are few (64-row blocks for at most 3/4 of the
   SMs: x v's k splits as float32 [M, r] sums, then out's columns split across the SMs; otherwise
   a call with fewer row blocks than SMs splits out's columns, each split reading its x rows
   again, from L2 after the first). The two passes' sums go through a buffer per (device, stream)
   made on first use (splits x M x r float32: a few MB) and kept until fusedk_shutdown; at most
   64 streams, past them (or without the memory) the one pass runs. A captured graph keeps the
   buffer of the stream it was captured on: it must not run at the same time as lowrank_update
   calls on that stream or other graphs captured there, as with attention's. f16/bf16 rows
   16-byte aligned on tensor cores: h = scaling (x v) codes accumulates in float32 and is rounded
   once to the dtype for the second product (float16: an h past 65504 becomes inf there);
   float32, and views the tensor cores' 16-byte loads can't take, on CUDA cores with h in float32
   (so an unaligned view of the same data can differ in its last bits). */
FUSEDK_DEF fusedk_status fusedk_lowrank_update(const fusedk_tensor *out, const fusedk_tensor *x, const fusedk_tensor *v,
                                               const fusedk_tensor *codes, const fusedk_tensor *u_t,
                                               const fusedk_tensor *y, float scaling, float beta,
                                               struct CUstream_st *stream);
/* A LoRA folded into its base linear: y = act(x w^T + bias + ((x a^T) * codes) (scaling b)^T),
   one cuBLASLt GEMM over K + A rp columns (rp = r rounded up to 8, A adapters).
   lowrank_prepare, once an adapter (and again when w, b or scaling change): w_cat [N, K + rp] =
   [w | scaling b | 0], scaling b rounded once to the dtype (past its range, float16's 65504, it is
   inf in w_cat, and with it every row's y NaN, adapter or not: 0 h times inf). w [N, K] (nn.Linear's
   weight), b [N, r] (peft's lora_B), rank r 1..128. Several adapters: b [A, N, r] stacked, w_cat
   [N, K + A rp] = [w | scaling b_0 | 0 | scaling b_1 | 0 ...], A rp at most 128.
   linear_lowrank, each call: x [..., K]; w_cat from lowrank_prepare; a [r, K] (peft's lora_A),
   or [A, r, K] stacked as b (A and r come from a: w_cat's width tells only A rp, so an a and a b
   of other A or r with the same A rp pass and mix the adapters up); codes [..., r] (x's leading
   dims, optional: BEM's per-row codes, on each adapter's h); adapter_ids (int32 [M], M = x's rows
   flattened, contiguous, optional): row m takes adapter ids[m] alone, an id outside 0..A-1 (-1)
   none (its y is the base linear's); without ids every adapter acts on every row (peft's several
   active adapters: their sum); bias [N], act and aux_out (the pre-activation, what the backward
   needs for act != NONE; optional) as linear's.
   h = (x a^T) * codes, rounded once to the dtype (float16: past 65504 it is inf), and zeros up to
   rp are the GEMM's last columns of K beside x: y[m, n] = act(sum_k x[m, k] w_cat[n, k] + sum_j
   h[m, j] w_cat[n, K + j] + bias[n]). CPU: every dtype, double accumulation, one rounding of h and
   one of y. The GEMM's width is what an adapter costs, whichever rows take it: A rp more columns
   of K for A adapters. GPU: one pass reads x once and writes [x | h] into a buffer of the stream
   (where its 64-row blocks fill at most 3/4 of the SMs it splits x's columns across blocks, and a
   second pass adds their float32 h in a fixed order); the buffer grows to the largest call, and
   outgrown ones are kept, as linear's scratch, for graphs captured earlier (a stream whose M keeps
   growing holds up to about 3x the largest M (K + A rp) elements until fusedk_shutdown). Then
   linear's GEMM runs on it: the adapter costs the copy (2 M K elements) and A rp / K more flops.
   x with room for h: x [..., K + A rp] with K a's last dim (its first K columns x, the last A rp
   the call's to write: a producer wrote x into such a buffer): h goes into x's own rows and the
   GEMM reads them in place, the copy gone (the pass reads x once and writes M A rp elements); x
   may then not overlap w_cat, bias, a, codes or adapter_ids either. The backward takes x's first
   K columns (the view). y may not overlap an input.
   The backward, for training adapters (the frozen w and b_0's w_cat not differentiated): with
   dz = dy (lowrank_update's dout) times act'(aux) rounded to the dtype as linear_backward's, per
   adapter q (lowrank_update: one, with P = v, Q = scaling u_t^T; linear_lowrank: P_q = a_q^T,
   Q_q = w_cat's columns K + q rp .. K + q rp + r - 1, that is scaling b_q) and row m:
     h_q = x P_q,  g_q = h_q * codes (0 on a row whose id is not q),  dg_q = dz Q_q,
     dx = sum_q (dg_q * codes) P_q^T  (+ dz w for linear_lowrank: w_cat's first K columns),
     dv = x^T (dg * codes)  /  da_q = (dg_q * codes)^T x,
     du_t = scaling g^T dz  /  db_q = scaling dz^T g_q,
     dcodes = sum_q dg_q * h_q,  dbias = dz summed over the rows (linear_lowrank_backward).
   Each output optional (NULL: not computed; dcodes needs codes), each like its input (db like b:
   [N, r] or [A, N, r]); none may overlap another argument. CPU: double accumulation, one rounding
   of each output. GPU: cuBLASLt GEMMs (h and dg in float32, [M, A r] each; dg * codes and
   scaling g rounded to the dtype for the GEMMs that take them; linear_lowrank's dx is
   (dg * codes) a, rounded to the dtype, then dz w added onto it by the GEMM that computes it:
   float32 throughout where dx's rows are not 16-byte aligned) and two small fusedk passes;
   the scratch is linear's (per stream, kept). The dy w GEMM of linear_lowrank_backward is
   linear_backward's dx: a LoRA's backward costs that and the narrow [M, A r] GEMMs.
   Instead, on 16-bit tensors with K and N multiples of 8, 16-byte rows of x, dy, u_t / w_cat, a
   and dx, one adapter, and rows for 64-row blocks on at least 3/4 of the SMs, one kernel does
   lowrank_update_backward, and linear_lowrank_backward but for dz w (then added onto its dx by
   cuBLASLt): tensor cores, dz read once, x twice, dx written once, the same roundings of dh and
   g; its dv / da and du_t / db are float32 sums over the row blocks taken in no fixed order, so
   their bits may differ from run to run by the float32 rounding (dx, dcodes and dbias are the
   same bits every run). */
FUSEDK_DEF fusedk_status fusedk_lowrank_prepare(const fusedk_tensor *w_cat, const fusedk_tensor *w,
                                                const fusedk_tensor *b, float scaling, struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_linear_lowrank(const fusedk_tensor *y, const fusedk_tensor *aux_out,
                                               const fusedk_tensor *x, const fusedk_tensor *w_cat,
                                               const fusedk_tensor *bias, const fusedk_tensor *a,
                                               const fusedk_tensor *codes, const fusedk_tensor *adapter_ids,
                                               fusedk_activation act, struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_lowrank_update_backward(const fusedk_tensor *dx, const fusedk_tensor *dv,
                                                        const fusedk_tensor *du_t, const fusedk_tensor *dcodes,
                                                        const fusedk_tensor *dout, const fusedk_tensor *x,
                                                        const fusedk_tensor *v, const fusedk_tensor *codes,
                                                        const fusedk_tensor *u_t, float scaling,
                                                        struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_linear_lowrank_backward(const fusedk_tensor *dx, const fusedk_tensor *da,
                                                        const fusedk_tensor *db, const fusedk_tensor *dcodes,
                                                        const fusedk_tensor *dbias, const fusedk_tensor *dy,
                                                        const fusedk_tensor *x, const fusedk_tensor *w_cat,
                                                        const fusedk_tensor *a, const fusedk_tensor *codes,
                                                        const fusedk_tensor *adapter_ids, const fusedk_tensor *aux,
                                                        fusedk_activation act, float scaling,
                                                        struct CUstream_st *stream);

/* ---- [conv] convolution over channels-last images and videos ----
   conv: out[n, t, h, w, co] = act(z) + residual[n, t, h, w, co], with
     z = bias[co] + sum over taps (i, j, k) and ci of
         x[n, t stride_t + i - pad_t, h stride + j - padding, w stride + k - padding, ci] w[co, i, j, k, ci]
   x [N, T, H, W, Ci] (NDHWC, a video) or [N, H, W, Ci] (NHWC, an image: no t, i, and the time
   attributes left at their defaults); w [Co, kt, kh, kw, Ci] or [Co, kh, kw, Ci], any kernel size
   (torch's Conv weight [Co, Ci, kh, kw] is w.permute(0, 2, 3, 1)); bias [Co] and residual (out's
   shape) optional; out [N, To, Ho, Wo, Co] with Ho = (H + 2 padding - kh) / stride + 1 (floor; Wo
   likewise) and To = (T + pad_t + pad_t_back - kt) / stride_t + 1. Spatial padding: `padding`
   each side; time: pad_t frames in front and pad_t_back behind. Both are zeros unless `replicate`
   says otherwise, a bit mask: 1, the time padding repeats the first frame in front and the last
   behind; 2, the spatial padding repeats the edge pixels (torch's padding_mode "replicate").
   The video VAEs' causal convs are pad_t = kt - 1, pad_t_back = 0, with zeros (Wan), the first
   frame (LTX-Video: replicate 1) or edge pixels and first frame alike (Mochi: replicate 3).
   upsample u >= 1 reads x as its nearest-neighbour upsampling by u on H and W (x[.., h / u, w / u,
   .], the decoders' Upsample2D + conv: the upsampled image is never written); H and W above are
   then the upsampled ones.
   act: FUSEDK_ACT_NONE (default), SILU, RELU, GELU, GELU_TANH on z in full precision; one
   rounding to the dtype after the residual (a ResNet block's conv2 + shortcut). Any strides but
   a contiguous channel dim (x, out, residual: NHWC views of a larger buffer work); out may not
   overlap an input. CPU: every dtype, double accumulation. GPU: f16/bf16 (float32 is refused),
   an implicit GEMM over M = N To Ho Wo rows, Co columns and K = kt kh kw Ci on the tensor cores
   (wgmma on sm_90a; mma.sync elsewhere, and with FUSEDK_NO_TMA=1 in the environment), float32
   accumulation in a fixed order (the same bits every run); channels that are multiples of
   8 with 16-byte aligned pixels take 16-byte asynchronous copies, any other the element path.
   fold_batchnorm: BatchNorm's running statistics folded into the conv before it, so Conv + BN
   (+ act) is one conv: s[co] = gamma[co] / sqrt(var[co] + eps), w_out[co, ...] = w[co, ...] s[co],
   b_out[co] = (bias[co] - mean[co]) s[co] + beta[co]; gamma, beta (affine = False: 1 and 0) and
   bias optional; w [Co, ...] in any layout whose dims after the first are compact (torch's
   NCHW weight or its channels-last permutation), w_out like it (w itself: in place), the rest
   [Co]. Double math, one rounding of each output, CPU and GPU alike. */
FUSEDK_DEF fusedk_status fusedk_conv(const fusedk_tensor *out, const fusedk_tensor *x, const fusedk_tensor *w,
                                     const fusedk_tensor *bias, const fusedk_tensor *residual, int32_t stride,
                                     int32_t padding, int32_t stride_t, int32_t pad_t, int32_t pad_t_back,
                                     int32_t replicate, fusedk_activation act, int32_t upsample,
                                     struct CUstream_st *stream);
/* group_norm: channels-last GroupNorm, the VAEs' norm before each conv. x [N, ..., C] (the dims
   between N and C are the L pixels: [N, H, W, C], [N, T, H, W, C]; they must flatten to one pixel
   stride), `groups` G dividing C; per sample n and group g, mean and variance (biased) over its
   L x C/G elements, then
     y = act(((x - mean) rsqrt(var + eps) weight[c] + bias[c]) (1 + scale[n, c]) + shift[n, c])
   weight, bias [C] and scale, shift [N, C] (any row stride: chunks of a conditioning projection)
   optional; act NONE (default), SILU (the ResNet block's GroupNorm + SiLU), RELU, GELU, GELU_TANH.
   One rounding. y may be x itself (in place) or any view of x's shape. CPU: double, the variance
   from the mean (two passes). GPU: three launches, x read twice: per (sample, pixel chunk,
   channel) float32 sums of x less its group's first element (a shift that keeps the variance's
   cancellation small), reduced per group in double in a fixed order (bits the same every run on
   a device), then the normalizing pass; the sums go in a buffer per (device, stream), made on
   first use and kept until fusedk_shutdown, as attention's. */
FUSEDK_DEF fusedk_status fusedk_group_norm(const fusedk_tensor *y, const fusedk_tensor *x, const fusedk_tensor *weight,
                                           const fusedk_tensor *bias, const fusedk_tensor *scale,
                                           const fusedk_tensor *shift, int32_t groups, float eps,
                                           fusedk_activation act, struct CUstream_st *stream);
/* channel_rmsnorm: the video VAEs' RMSNorm over the channels of each pixel (x [N, ..., C] channels
   last: the rows), with their modulation and activation:
     y = act((x r weight[c] + bias[c]) (1 + scale[n, c]) + shift[n, c])
   r = rsqrt(mean(x^2) + eps) (clamp 0: torch's RMSNorm, LTX-Video's VAE, eps 1e-8), or r = 1 /
   max(sqrt(mean(x^2)), eps) (clamp 1: F.normalize's form, Wan's VAE: its x / max(|x|, 1e-12)
   sqrt(C) is eps = 1e-12 / sqrt(C) with weight = gamma); weight, bias [C] and scale, shift [N, C]
   (n: x's first dim; LTX-Video's timestep-conditioned blocks) optional; act NONE (default) ... as
   conv's. One rounding. Rows as the norm family's (leading dims that flatten to at most two
   levels); y may be x itself. GPU: a warp a row, x read once from memory (the row again from L1). */
FUSEDK_DEF fusedk_status fusedk_channel_rmsnorm(const fusedk_tensor *y, const fusedk_tensor *x, const fusedk_tensor *weight,
                                                const fusedk_tensor *bias, const fusedk_tensor *scale,
                                                const fusedk_tensor *shift, float eps, int32_t clamp,
                                                fusedk_activation act, struct CUstream_st *stream);
FUSEDK_DEF fusedk_status fusedk_fold_batchnorm(const fusedk_tensor *w_out, const fusedk_tensor *b_out,
                                               const fusedk_tensor *w, const fusedk_tensor *bias,
                                               const fusedk_tensor *gamma, const fusedk_tensor *beta,
                                               const fusedk_tensor *mean, const fusedk_tensor *var, float eps,
                                               struct CUstream_st *stream);

/* ---- [registry] every op's tensors and attributes, for bindings (Python, XLA FFI) ----
   fusedk_op_call(i, tensors, attrs, stream) runs op i with its tensors in the order of
   fusedk_op_get(i)->tensors (= the C function's argument order; NULL = an absent optional one)
   and its attributes as doubles. Outputs name the input whose shape, dtype and device they take
   (`like`); an optional output exists exactly when the optional input `when` is given, or, for
   when <= -2, when attribute -2 - when is nonzero (linear's aux, linear_backward's dx, dw, db:
   fusedk_op_out_exists). */
typedef enum fusedk_op_id {
  FUSEDK_OP_RMSNORM = 0,
  FUSEDK_OP_LAYERNORM = 1,
  FUSEDK_OP_ADALN = 2,
  FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM = 3,
  FUSEDK_OP_ACT = 4,
  FUSEDK_OP_SILU_FMA = 5,
  FUSEDK_OP_GATED_RESIDUAL = 6,
  FUSEDK_OP_GLU = 7,
  FUSEDK_OP_GLU_PAIR = 8,
  FUSEDK_OP_ROPE = 9,
  FUSEDK_OP_ROPE_TABLE_1D = 10,
  FUSEDK_OP_ROPE_TABLE_AXES = 11,
  FUSEDK_OP_ROPE_TABLE_LTX = 12,
  FUSEDK_OP_ROPE_TABLE_MIXED = 13,
  FUSEDK_OP_DIFFUSION_STEP = 14,
  FUSEDK_OP_QK_NORM_ROPE = 15,
  FUSEDK_OP_LINEAR = 16,
  FUSEDK_OP_LINEAR_BACKWARD = 17,
  FUSEDK_OP_ATTENTION = 18,
  FUSEDK_OP_LOWRANK_UPDATE = 19,
  FUSEDK_OP_LOWRANK_PREPARE = 20,
  FUSEDK_OP_LINEAR_LOWRANK = 21,
  FUSEDK_OP_LOWRANK_UPDATE_BACKWARD = 22,
  FUSEDK_OP_LINEAR_LOWRANK_BACKWARD = 23,
  FUSEDK_OP_ATTENTION_INT8 = 24,
  FUSEDK_OP_ATTENTION_INT8_SCALED = 25,
  FUSEDK_OP_QK_NORM_ROPE_INT8 = 26,
  FUSEDK_OP_QUANTIZE_FP8 = 27,
  FUSEDK_OP_DEQUANTIZE_FP8 = 28,
  FUSEDK_OP_LINEAR_FP8 = 29,
  FUSEDK_OP_RMSNORM_FP8 = 30,
  FUSEDK_OP_LAYERNORM_FP8 = 31,
  FUSEDK_OP_ADALN_FP8 = 32,
  FUSEDK_OP_GLU_FP8 = 33,
  FUSEDK_OP_QUANTIZE_INT8 = 34,
  FUSEDK_OP_LINEAR_W8 = 35,
  FUSEDK_OP_CONV = 36,
  FUSEDK_OP_FOLD_BATCHNORM = 37,
  FUSEDK_OP_GROUP_NORM = 38,
  FUSEDK_OP_CHANNEL_RMSNORM = 39
} fusedk_op_id;                 /* new ops go at the end: the ids are ABI */
#define FUSEDK_OP_COUNT 40
#define FUSEDK_OP_MAX_TENSORS 12
#define FUSEDK_OP_MAX_ATTRS 8

typedef enum fusedk_arg_kind {
  FUSEDK_ARG_IN = 0,
  FUSEDK_ARG_IN_OPT = 1,
  FUSEDK_ARG_OUT = 2,
  FUSEDK_ARG_OUT_OPT = 3
} fusedk_arg_kind;

/* How an argument's shape relates to the op's reference tensor, its first required input (x;
   the error messages name it), or for an output to its `like` input. Leading dims of the ROW
   tensors flatten jointly into rows. */
typedef enum fusedk_arg_role {
  FUSEDK_ROLE_ROW = 0,          /* the reference's (an output: its like's) shape [..., D] */
  FUSEDK_ROLE_COLUMN = 1,       /* [D], contiguous: a per-column operand (weight, bias) */
  FUSEDK_ROLE_SAMPLE = 2,       /* [B, D] of a [B, L, D] op, any row stride (0 broadcasts) */
  FUSEDK_ROLE_ROW_HALF = 3,     /* like's leading dims, half its last dim [..., D/2] */
  FUSEDK_ROLE_OWN = 4,          /* checked by the op (rope's k and tables); outputs: the shape
                                   fusedk_op_out_shape gives */
  FUSEDK_ROLE_ROW_SCALE = 5     /* like's leading dims [...] ([1] for a 1-d like): a scale a row */
} fusedk_arg_role;

typedef enum fusedk_attr_type {
  FUSEDK_ATTR_F32 = 0,          /* a float (eps) */
  FUSEDK_ATTR_I32 = 1           /* an int, flag or enum (norm, exact) */
} fusedk_attr_type;

typedef struct fusedk_op_tensor {
  const char *name;
  int32_t kind;                 /* fusedk_arg_kind */
  int32_t like;                 /* outputs: the input they copy shape/dtype/device from; else -1 */
  int32_t when;                 /* FUSEDK_ARG_OUT_OPT: the optional input that makes it exist, or
                                   -2 - k: attribute k asks for it; else -1 */
  int32_t role;                 /* fusedk_arg_role */
  int32_t scalar;               /* -1: the reference's dtype; -2: the reference's dtype or float32
                                   (a modulation kept in float32 beside 16-bit rows); -3: the
                                   dtype the op's out_dtype attribute names (f32, f16, bf16; one
                                   for every -3 tensor of a call); else always this fusedk_scalar */
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
  int32_t row_ndim;             /* 0: rows of any rank [..., D]; 3: exactly [B, L, D];
                                   4: exactly [B, S, H, Dh]; -1: no rows (the op checks shapes) */
  fusedk_op_tensor tensors[12]; /* FUSEDK_OP_MAX_TENSORS */
  fusedk_op_attr attrs[8];      /* FUSEDK_OP_MAX_ATTRS */
} fusedk_op;

FUSEDK_DEF const fusedk_op *fusedk_op_get(int32_t i);        /* NULL unless 0 <= i < FUSEDK_OP_COUNT */
FUSEDK_DEF int32_t fusedk_op_find(const char *name);         /* -1 if no op has that name */
FUSEDK_DEF fusedk_status fusedk_op_call(int32_t i, const fusedk_tensor *const *tensors, const double *attrs,
                                        struct CUstream_st *stream);
/* The shape of output `out` of op i (ndim returned, sizes in shape[FUSEDK_MAX_DIMS]) given its
   inputs (tensors in registry order; only ndim and shape are read) and attributes; a negative
   status (-FUSEDK_ERR_SHAPE, ...) when the inputs it needs are missing or make no such output
   (fusedk_failure_reason says why). What
   every binding allocates. Its dtype: fusedk_op_out_scalar's. */
FUSEDK_DEF int32_t fusedk_op_out_shape(int32_t i, int32_t out, const fusedk_tensor *const *tensors,
                                       const double *attrs, int64_t *shape);
/* The fusedk_scalar of tensor `out` of op i: its fixed dtype, the out_dtype attribute's value for
   scalar -3, or -1 where it takes the like input's (or the reference's) dtype. */
FUSEDK_DEF int32_t fusedk_op_out_scalar(int32_t i, int32_t out, const double *attrs);
/* 1 if output `out` of op i exists for these inputs (NULL = absent) and attributes, else 0. */
FUSEDK_DEF int32_t fusedk_op_out_exists(int32_t i, int32_t out, const fusedk_tensor *const *tensors,
                                        const double *attrs);

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
#include <math.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Sets the calling thread's failure reason (fusedk_failure_reason) and returns s: both halves
   report through it. */
fusedk_status fusedk__fail(fusedk_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

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
  int32_t mod;      /* scale's and shift's fusedk_scalar: scalar, or float32 beside 16-bit rows */
  int32_t rms;      /* 1: RMSNorm statistics, 0: LayerNorm */
  int32_t exact;    /* Mochi's PyTorch rounding points (gate and base) */
  float eps;
  int64_t B, L, D;
  fusedk__rows x, res, res_out, y, base;
  fusedk__rows scale, shift, gate;
  const void *weight, *bias; /* [D] contiguous */
  int32_t q8;       /* the _fp8 forms: y e4m3, ys its float32 row scales */
  fusedk__rows ys;
} fusedk__norm_args;

/* Every op of the elementwise family: y = f(in[0], ..., in[3]) per element; in[k].p == NULL:
   absent. gated_residual's gate is in[2] as a per-sample vector (sl = 0). glu and glu_pair run
   as op FUSEDK_OP_GLU: y = act(in[0]) * in[1] (glu: the two halves of x's rows, D = H).
   diffusion_step: in = x, cond, uncond, prev; kind = sampler; c = its coefficients (FUSEDK__C_*). */
enum { FUSEDK__C_GUIDANCE, FUSEDK__C_DT, FUSEDK__C_SQRT_1MA, FUSEDK__C_RSQRT_A, FUSEDK__C_CLAMP,
       FUSEDK__C_SQRT_AP, FUSEDK__C_SQRT_1MAP, FUSEDK__C_BLEND, FUSEDK__N_C };
typedef struct fusedk__ew_args {
  int32_t op;       /* fusedk_op_id */
  int32_t scalar;   /* fusedk_scalar */
  int32_t mod;      /* in[2]'s fusedk_scalar: scalar, or float32 (gated_residual's gate) */
  int32_t kind;     /* fusedk_activation (act), fusedk_sampler (diffusion_step) */
  int64_t B, L, D;
  fusedk__rows y, in[4];
  double c[FUSEDK__N_C];
} fusedk__ew_args;

/* rope and qk_norm_rope: q, k, v (t[0..2]; in == NULL: none, only a suffix may be absent) as
   [B, S, H, Dh] with element strides, written through their out strides (any layout). q and k
   are RMS-normalized first (norm: FUSEDK_QK_NORM_*; rope: NONE) with weight w (Dh, or H*Dh for
   FULL; NULL: none), then rotated; v is copied. The tables (tab[0] cos, tab[1] sin) as
   [B, S, H, R/2] strides (0 broadcasts, last dim 1). q8 (qk_norm_rope_int8): q' and k' go out
   as int8 rows (out, its strides in bytes) with their float32 scales (sc, strides cb, cs, ch). */
typedef struct fusedk__rope_args {
  int32_t scalar, style, norm, q8;
  float eps;
  int64_t B, S, Dh, R;
  struct {
    const void *in; void *out; const void *w; int64_t H, sb, ss, sh, ob, os, oh;
    float *sc; int64_t cb, cs, ch;
  } t[3];
  struct { const float *p; int64_t sb, ss, sh; } tab[2];
} fusedk__rope_args;

/* The table builders: cos, sin [S, H, F] (H = 1 but for mixed) from in [S, n] (positions: n = 1)
   and, for mixed, freqs [3, H, F]; strides in elements. */
typedef struct fusedk__table_args {
  int32_t op;       /* FUSEDK_OP_ROPE_TABLE_* */
  int64_t S, H, F;
  float *out[2];    /* cos, sin */
  int64_t os[2], oh[2];
  const float *in;
  int64_t is, ia;
  const float *freqs;
  int64_t fa, fh;
  int32_t dims[4];  /* axes: each axis' dim; 1d, ltx: dims[0] = dim */
  int32_t n_axes;
  double theta;
} fusedk__table_args;

/* The angle of table entry (s, h, f), in double: the table builders' one formula, for the CPU
   reference and the kernel alike. */
#if defined(__CUDACC__)
#define FUSEDK__HD __host__ __device__
#else
#define FUSEDK__HD
#endif
static inline FUSEDK__HD double fusedk__table_angle(const fusedk__table_args *a, int64_t s, int64_t h, int64_t f) {
  const float *in = a->in + s * a->is;
  if (a->op == FUSEDK_OP_ROPE_TABLE_MIXED) { /* Mochi: sum over the 3 axes of pos * freqs */
    double acc = 0.0;
    for (int k = 0; k < 3; ++k) acc += (double)in[k * a->ia] * (double)a->freqs[k * a->fa + h * a->fh + f];
    return acc;
  }
  if (a->op == FUSEDK_OP_ROPE_TABLE_LTX) { /* (dim % 6)/2 padding columns, then frequency-major */
    const int64_t pad = (a->dims[0] % 6) / 2, n = a->dims[0] / 6;
    if (f < pad) return 0.0; /* cos 1, sin 0 */
    const int64_t j = f - pad, fi = j / 3;
    const double e = n > 1 ? (double)fi / (double)(n - 1) : 0.0;
    return pow(a->theta, e) * 1.57079632679489662 * (2.0 * (double)in[(j % 3) * a->ia] - 1.0);
  }
  int k = 0; /* 1d (one axis) and axes: the axis whose block holds column f */
  while (k + 1 < a->n_axes && f >= a->dims[k] / 2) f -= a->dims[k++] / 2;
  return (double)in[k * a->ia] * pow(a->theta, -2.0 * (double)f / (double)a->dims[k]);
}

/* linear and linear_backward: row-major matrices as pointer + row stride (elements); p == NULL:
   absent. Forward: y[M, N] = act(x[M, K] w[N, K]^T + bias), aux = the pre-activation.
   Backward: dx[M, K], dw[N, K], db[N] from dy[M, N], x, w and aux (act != NONE). */
typedef struct fusedk__mat {
  void *p;
  int64_t ld;
} fusedk__mat;
typedef struct fusedk__linear_args {
  int32_t op;       /* FUSEDK_OP_LINEAR, _LINEAR_BACKWARD, _LINEAR_FP8 or _LINEAR_W8 */
  int32_t scalar;   /* fusedk_scalar (y's for LINEAR_FP8) */
  int32_t act;      /* fusedk_activation */
  int32_t tf32;     /* float32: 1 = TF32 tensor cores */
  int64_t M, N, K;
  fusedk__mat y, aux, x, w, dx, dw, dy;
  void *bias, *db;  /* [N] contiguous */
  const float *xs, *ws; /* LINEAR_FP8: x's scales [M] and w's [N] (x, w: e4m3 data), contiguous;
                           LINEAR_W8: w's (int8 data), x of `scalar` */
  int32_t fast_accum;   /* LINEAR_FP8: the tensor cores' own accumulation over all of K */
} fusedk__linear_args;

/* quantize_fp8 (dequant 0): x rows -> e4m3 rows q and float32 scales qs; dequantize_fp8
   (dequant 1): (q, qs) -> x rows. B x L rows of D; qs's strides in floats, its sl the scale's.
   glu_fp8: act >= 0 (a fusedk_activation), the rows quantized are act(x) * x2 (x the act half).
   quantize_int8 (i8 1): int8 data in [-128, 127], 127.5 for 448. */
typedef struct fusedk__quant_args {
  int32_t scalar;   /* x's fusedk_scalar */
  int32_t dequant;
  int32_t act;      /* glu_fp8's activation, else -1 */
  int64_t B, L, D;
  fusedk__rows x, x2, q, qs;
  int32_t i8;       /* quantize_int8: q is int8 */
} fusedk__quant_args;

/* attention: q [B, Sq, Hq, Dh], k, v [B, Sk, Hkv, Dh], out like q, as element strides over
   (b, s, h); lse [B, Hq, Sq] float32 (p == NULL: not asked for); kv_len int32 [B] or NULL. */
typedef struct fusedk__attn_scales { /* a scaled tensor's scales, [B, S, H] */
  const float *p;
  int64_t sb, ss, sh;
} fusedk__attn_scales;
typedef struct fusedk__attn_args {
  int32_t scalar, causal, int8; /* int8: attention_int8 (q, k quantized, fusedk_attention_int8) */
  int32_t scaled;               /* attention_int8_scaled: q, k int8 data, qs and ks their scales */
  float scale;
  int64_t B, Sq, Sk, Hq, Hkv, Dh;
  struct { const void *p; int64_t sb, ss, sh; } q, k, v;
  fusedk__attn_scales qs, ks;
  struct { void *p; int64_t sb, ss, sh; } out;
  struct { float *p; int64_t sb, sh, ss; } lse;
  const int32_t *kv_len;
  int64_t kv_stride;
} fusedk__attn_args;

/* lowrank_update: out, x, codes, y [M, *] and v, u_t as matrices (p, row stride); codes.p / y.p
   NULL when absent. mode FUSEDK__LR_CAT (linear_lowrank's first pass): out [M, K1 + A rp] = [x |
   h_0 | 0 | h_1 | 0 ...] with v holding a [A, r, K1] (no u_t, y; scaling 1); FUSEDK__LR_PREPARE:
   out [M, K1 + A rp] = [x | scaling v_0 | 0 ...] with x = w [N, K], v = b [A, N, r] */
enum { FUSEDK__LR_UPDATE = 0, FUSEDK__LR_CAT = 1, FUSEDK__LR_PREPARE = 2 };
typedef struct fusedk__lowrank_args {
  int32_t mode, scalar, r;
  int32_t slots;            /* CAT, PREPARE: adapters A (v's [A, r, K1] or [A, N, r]), h's width A rp */
  float scaling, beta;
  int64_t M, K1, K2;
  int64_t va;               /* CAT, PREPARE: v's adapter stride (elements) */
  fusedk__mat out, x, v, codes, u_t, y;
  const int32_t *ids;       /* CAT: adapter_ids [M] (contiguous) or NULL: every adapter on every row */
  float *part;              /* CAT on the GPU: room for the k splits' float32 h [splits, M, A rp]
                               (lowrank_update's two passes: the kernels' own buffer) */
  int32_t part_splits;      /* the splits part has room for (the most the pass may use) */
} fusedk__lowrank_args;

/* lowrank_update_backward (lora 0) and linear_lowrank_backward (lora 1), as fusedk.h's [lowrank]
   comment writes them: x [M, K], dy and aux [M, N]; p: v [K, r] or a_0 [r, K] (adapter q at
   q pa elements on), q: u_t [r, N] or w_cat [N, K + A rp]; outputs like them (p.NULL: not asked
   for): dp like p (adapter stride dpa), dq like u_t or db [A, N, r] (adapter stride dqa). */
typedef struct fusedk__lowrank_grad_args {
  int32_t lora, scalar, act, r, slots;
  float scaling;
  int64_t M, K, N, pa, dpa, dqa;
  fusedk__mat dy, x, aux, p, q, codes;
  fusedk__mat dx, dp, dq, dcodes;
  const int32_t *ids;       /* adapter_ids [M] (contiguous) or NULL */
  void *dbias;              /* [N] contiguous, or NULL */
} fusedk__lowrank_grad_args;

/* conv, as fusedk.h's [conv] comment writes it, images as videos of one frame (T = To = kt = 1):
   x [N, T, H, W, Ci], w [Co, kt, kh, kw, Ci], out and res [N, To, Ho, Wo, Co], each by its strides
   (elements) of the four leading dims, the channels contiguous. */
typedef struct fusedk__conv_args {
  int32_t scalar, act, replicate, up; /* up: x's nearest upsampling; H and W are the upsampled dims */
  int32_t stride, pad, stride_t, pad_t;
  int64_t N, T, H, W, Ci, To, Ho, Wo, Co, kt, kh, kw;
  const void *x, *w, *bias, *res;
  void *out;
  int64_t xs[4], ws[4], os[4], rs[4];
} fusedk__conv_args;

/* group_norm: x and y [N, L, C] by their sample and pixel strides (elements), C contiguous;
   weight, bias [C] contiguous, scale, shift [N, C] by their sample strides; NULL when absent. */
typedef struct fusedk__gn_args {
  int32_t scalar, act, groups;
  float eps;
  int64_t N, L, C, xs[2], ys[2], ss[2];
  const void *x, *weight, *bias, *scale, *shift;
  void *y;
} fusedk__gn_args;

/* channel_rmsnorm: B x L rows of D channels (x, y by their row strides), weight, bias [D] or NULL;
   scale, shift [N, D] by their sample strides ss, row r (b L + l) of sample r / P, or NULL */
typedef struct fusedk__crms_args {
  int32_t scalar, act, clamp;
  float eps;
  int64_t B, L, D, P, ss[2];
  fusedk__rows x, y;
  const void *weight, *bias, *scale, *shift;
} fusedk__crms_args;

/* fold_batchnorm: w and w_out [Co, R] rows (R compact elements, row strides ws and wos); the
   vectors [Co] contiguous, gamma, beta and bias NULL when absent. */
typedef struct fusedk__fold_args {
  int32_t scalar;
  float eps;
  int64_t Co, R, ws, wos;
  const void *w, *bias, *gamma, *beta, *mean, *var;
  void *w_out, *b_out;
} fusedk__fold_args;

fusedk_status fusedk__cuda_norm(const fusedk__norm_args *a, const char *op, int32_t device_id,
                                struct CUstream_st *stream);
fusedk_status fusedk__cuda_elementwise(const fusedk__ew_args *a, const char *op, int32_t device_id,
                                       struct CUstream_st *stream);
fusedk_status fusedk__cuda_rope(const fusedk__rope_args *a, const char *op, int32_t device_id,
                                struct CUstream_st *stream);
fusedk_status fusedk__cuda_rope_table(const fusedk__table_args *a, const char *op, int32_t device_id,
                                      struct CUstream_st *stream);
fusedk_status fusedk__cuda_linear(const fusedk__linear_args *a, const char *op, int32_t device_id,
                                  struct CUstream_st *stream);
fusedk_status fusedk__cuda_quant(const fusedk__quant_args *a, const char *op, int32_t device_id,
                                 struct CUstream_st *stream);
void fusedk__cuda_shutdown(void);
fusedk_status fusedk__cuda_attention(const fusedk__attn_args *a, const char *op, int32_t device_id,
                                     struct CUstream_st *stream);
fusedk_status fusedk__cuda_lowrank(const fusedk__lowrank_args *a, const char *op, int32_t device_id,
                                   struct CUstream_st *stream);
/* linear_lowrank: h's pass (lowrank's FUSEDK__LR_CAT, its out set here to the stream's buffer, or
   already x's own rows: x with room for h), then l's GEMM with that out as x */
fusedk_status fusedk__cuda_linear_lowrank(const fusedk__linear_args *l, const fusedk__lowrank_args *h,
                                          const char *op, int32_t device_id, struct CUstream_st *stream);
fusedk_status fusedk__cuda_lowrank_grad(const fusedk__lowrank_grad_args *a, const char *op, int32_t device_id,
                                        struct CUstream_st *stream);
/* the low-rank backward's one-pass kernel (the lowrank part), for calls the kernels' file says it
   fits: dx (linear_lowrank: dh a, the caller adds dz w) and dcodes; dv^T / da and du_t / db^T
   added into float32 sums sv [r, ldv], su [r, ldu] that the caller zeroes (NULL: not asked for) */
fusedk_status fusedk__cuda_lowrank_grad_pass(const fusedk__lowrank_grad_args *a, float *sv, int64_t ldv, float *su,
                                             int64_t ldu, const char *op, int32_t device_id,
                                             struct CUstream_st *stream);
fusedk_status fusedk__cuda_conv(const fusedk__conv_args *a, const char *op, int32_t device_id,
                                struct CUstream_st *stream);
fusedk_status fusedk__cuda_fold_batchnorm(const fusedk__fold_args *a, const char *op, int32_t device_id,
                                          struct CUstream_st *stream);
fusedk_status fusedk__cuda_group_norm(const fusedk__gn_args *a, const char *op, int32_t device_id,
                                      struct CUstream_st *stream);
fusedk_status fusedk__cuda_channel_rmsnorm(const fusedk__crms_args *a, const char *op, int32_t device_id,
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
/* an entry point of one argument struct: NO_CUDA */
#define FUSEDK__NO_CUDA_OP(fn, args_t)                                                       \
  fusedk_status fn(const args_t *a, const char *op, int32_t id, struct CUstream_st *s) { \
    (void)a, (void)id, (void)s;                                                            \
    return fusedk__no_cuda(op);                                                            \
  }
FUSEDK__NO_CUDA_OP(fusedk__cuda_norm, fusedk__norm_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_elementwise, fusedk__ew_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_rope, fusedk__rope_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_rope_table, fusedk__table_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_linear, fusedk__linear_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_quant, fusedk__quant_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_attention, fusedk__attn_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_lowrank, fusedk__lowrank_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_lowrank_grad, fusedk__lowrank_grad_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_conv, fusedk__conv_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_fold_batchnorm, fusedk__fold_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_group_norm, fusedk__gn_args)
FUSEDK__NO_CUDA_OP(fusedk__cuda_channel_rmsnorm, fusedk__crms_args)
#undef FUSEDK__NO_CUDA_OP
void fusedk__cuda_shutdown(void) {}
fusedk_status fusedk__cuda_linear_lowrank(const fusedk__linear_args *l, const fusedk__lowrank_args *h, const char *op,
                                          int32_t id, struct CUstream_st *s) {
  (void)l, (void)h, (void)id, (void)s;
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
FUSEDK_DEF void fusedk_shutdown(void) { fusedk__cuda_shutdown(); }

/* --- [tensors] dtypes, strides, the per-argument checks --------------------------------- */

FUSEDK_DEF fusedk_dtype fusedk_dtype_of(fusedk_scalar s) {
  fusedk_dtype d;
  d.code = (uint8_t)(s == FUSEDK_BF16                    ? FUSEDK_DTYPE_BFLOAT
                     : s == FUSEDK_I32 || s == FUSEDK_I8 ? FUSEDK_DTYPE_INT
                     : s == FUSEDK_E4M3                  ? FUSEDK_DTYPE_FLOAT8_E4M3FN
                                                         : FUSEDK_DTYPE_FLOAT);
  d.bits = (uint8_t)(s == FUSEDK_F32 || s == FUSEDK_I32 ? 32 : s == FUSEDK_I8 || s == FUSEDK_E4M3 ? 8 : 16);
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

/* -1 if the dtype is not one fusedk takes (int8, e4m3 and int32: only where an op fixes them) */
static int fusedk__scalar_of(fusedk_dtype d) {
  if (d.lanes != 1) return -1;
  if (d.code == FUSEDK_DTYPE_FLOAT && d.bits == 32) return FUSEDK_F32;
  if (d.code == FUSEDK_DTYPE_FLOAT && d.bits == 16) return FUSEDK_F16;
  if (d.code == FUSEDK_DTYPE_BFLOAT && d.bits == 16) return FUSEDK_BF16;
  if (d.code == FUSEDK_DTYPE_INT && d.bits == 32) return FUSEDK_I32;
  if (d.code == FUSEDK_DTYPE_INT && d.bits == 8) return FUSEDK_I8;
  if (d.code == FUSEDK_DTYPE_FLOAT8_E4M3FN && d.bits == 8) return FUSEDK_E4M3;
  return -1;
}

/* A DLPack dtype by name: float64, int32, uint8, bool, complex64, bfloat16, float16x2,
   float8_e4m3fn, ... */
static const char *fusedk__dtype_str(fusedk_dtype d, char *buf, size_t n) {
  static const char *const kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  static const char *const f8[] = {"float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
                                   "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"};
  const char *k = d.code < 7 ? kinds[d.code] : NULL;
  int len = d.code >= 7 && d.code <= 14 && d.bits == 8 ? snprintf(buf, n, "%s", f8[d.code - 7])
            : k && d.code == 6 && d.bits == 8 ? snprintf(buf, n, "bool")
            : k ? snprintf(buf, n, "%s%d", k, (int)d.bits)
                : snprintf(buf, n, "(code %d, bits %d)", (int)d.code, (int)d.bits);
  if (d.lanes != 1 && len >= 0 && (size_t)len < n) snprintf(buf + len, n - (size_t)len, "x%d", (int)d.lanes);
  return buf;
}

static size_t fusedk__scalar_size(int s) {
  return s == FUSEDK_F32 || s == FUSEDK_I32 ? 4 : s == FUSEDK_I8 || s == FUSEDK_E4M3 ? 1 : 2;
}
static const char *fusedk__scalar_name(int s) {
  return s == FUSEDK_F32 ? "float32" : s == FUSEDK_F16 ? "float16" : s == FUSEDK_BF16 ? "bfloat16"
         : s == FUSEDK_I32 ? "int32" : s == FUSEDK_I8 ? "int8" : "float8_e4m3fn";
}
/* int32, int8, e4m3: taken only where an op fixes them (never a call's computing dtype) */
static int fusedk__scalar_fixed_only(int s) { return s >= FUSEDK_I32; }

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
  int out_scalar;      /* the dtype of the tensors of scalar -3 (the first such one's), or -1 */
  const char *out_ref; /* that first one's name */
} fusedk__check;

/* Checks what every tensor argument needs: present (if required), a supported dtype equal to
   the call's, the call's device, element-aligned data, ndim in range, no negative sizes, and a
   contiguous last dim. Sets *present. */
static fusedk_status fusedk__check_tensor(fusedk__check *c, const fusedk_tensor *t, const char *name,
                                          int required, int fixed, int *present) {
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
  if (s < 0 || fusedk__scalar_fixed_only(s) != fusedk__scalar_fixed_only(fixed)) { /* 8-bit, int32: where fixed */
    char dt[48];
    return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected %s", c->op, name,
                        fusedk__dtype_str(t->dtype, dt, sizeof dt),
                        fixed >= 0 ? fusedk__scalar_name(fixed) : "float32, float16 or bfloat16");
  }
  if (fixed == -3) { /* the out_dtype attribute's: one for every such tensor of the call */
    if (c->out_scalar >= 0 && s != c->out_scalar)
      return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected %s (the dtype of %s)", c->op, name,
                          fusedk__scalar_name(s), fusedk__scalar_name(c->out_scalar), c->out_ref);
    if (c->out_scalar < 0) c->out_scalar = s, c->out_ref = name;
  }
  if (fixed >= 0 && s != fixed) {
    return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected %s", c->op, name, fusedk__scalar_name(s),
                        fusedk__scalar_name(fixed));
  } else if (c->scalar < 0) {
    c->scalar = s;
    c->dev = t->device;
    if (!fusedk__is_gpu(t->device.device_type) && t->device.device_type != FUSEDK_DEVICE_CPU &&
        t->device.device_type != FUSEDK_DEVICE_CUDA_HOST)
      return fusedk__fail(FUSEDK_ERR_DEVICE, "%s: %s is on device type %d, expected CPU (1), CUDA (2), "
                          "CUDA host (3) or CUDA managed (13)", c->op, name, (int)t->device.device_type);
  } else {
    if (fixed == -2 && s != c->scalar && s != FUSEDK_F32 && c->scalar != FUSEDK_F32)
      return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected %s (the dtype of %s) or float32", c->op,
                          name, fusedk__scalar_name(s), fusedk__scalar_name(c->scalar), c->ref);
    if ((fixed == -1 || (fixed == -2 && c->scalar == FUSEDK_F32)) && s != c->scalar)
      return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected %s (the dtype of %s)", c->op, name,
                          fusedk__scalar_name(s), fusedk__scalar_name(c->scalar), c->ref);
    int g0 = fusedk__is_gpu(c->dev.device_type), g1 = fusedk__is_gpu(t->device.device_type);
    int known = g1 || t->device.device_type == FUSEDK_DEVICE_CPU || t->device.device_type == FUSEDK_DEVICE_CUDA_HOST;
    if (!known || g0 != g1 || (g0 && t->device.device_id != c->dev.device_id))
      return fusedk__fail(FUSEDK_ERR_DEVICE, "%s: %s is on device (%d, %d), expected the device of %s (%d, %d)",
                          c->op, name, (int)t->device.device_type, (int)t->device.device_id, c->ref,
                          (int)c->dev.device_type, (int)c->dev.device_id);
  }
  int64_t n = 1, nz = 1; /* nz: the product of the non-zero sizes, which later products stay under */
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 0)
      return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has negative size %lld in dim %d", c->op, name,
                          (long long)t->shape[i], i);
    if (t->shape[i] && nz > (INT64_MAX >> 4) / t->shape[i]) {
      char shp[160];
      return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, sizes whose product passes 2^59", c->op, name,
                          fusedk__shape_str(t, shp, sizeof shp));
    }
    n *= t->shape[i];
    nz *= t->shape[i] ? t->shape[i] : 1;
  }
  int64_t reach = 0; /* sum |stride| (size - 1): the elements element 0 reaches, as bounded as the count */
  for (int i = 0; t->strides && i < t->ndim; ++i) { /* empty tensors too: their strides get multiplied */
    const int64_t st = t->strides[i], a = st < 0 ? (st == INT64_MIN ? INT64_MAX : -st) : st, m = t->shape[i] - 1;
    if (m > 0 && a > ((INT64_MAX >> 4) - reach) / m)
      return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has stride %lld in dim %d (size %lld): its strides reach past "
                          "2^59 elements", c->op, name, (long long)st, i, (long long)t->shape[i]);
    reach += a * m;
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
  return t ? (void *)((uintptr_t)t->data + t->byte_offset) : NULL; /* integer math: data may be NULL (empty) */
}

/* The byte range [lo, hi) a tensor's elements span (strides of any sign); lo == hi: empty. */
static void fusedk__extent(const fusedk_tensor *t, uintptr_t *lo, uintptr_t *hi) {
  const int64_t es = (int64_t)fusedk__scalar_size(fusedk__scalar_of(t->dtype));
  int64_t a = 0, b = 0;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] == 0) { *lo = *hi = 0; return; }
    const int64_t d = (t->shape[i] - 1) * fusedk__stride(t, i);
    if (d < 0) a += d; else b += d;
  }
  *lo = (uintptr_t)fusedk__base(t) + (uintptr_t)(a * es);
  *hi = (uintptr_t)fusedk__base(t) + (uintptr_t)((b + 1) * es);
}

/* An output sharing memory with another argument: a GEMM reads its inputs while it writes. */
static fusedk_status fusedk__check_disjoint(const fusedk__check *c, const fusedk_tensor *out, const char *oname,
                                            const fusedk_tensor *t, const char *name) {
  uintptr_t a0, a1, b0, b1;
  if (!out || !t) return FUSEDK_OK;
  fusedk__extent(out, &a0, &a1);
  fusedk__extent(t, &b0, &b1);
  if (a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1)
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: output %s overlaps %s in memory, expected separate buffers",
                        c->op, oname, name);
  return FUSEDK_OK;
}

/* --- [registry] each op once: arguments, attributes, output shapes; lookup and the generic call --- */

/* The shape rule of an op whose outputs include one of role OWN: output `out`'s shape from the
   inputs t (registry order) and attributes a, shape holding its like input's shape on entry;
   returns the ndim, or a negative status with the failure reason set. */
typedef int (*fusedk__shape_rule)(const fusedk_op *o, int out, const fusedk_tensor *like,
                                  const fusedk_tensor *const *t, const double *a, int64_t *shape);

/* [position]: the table builders' attribute checks (their entry points' too), then the rules */

static fusedk_status fusedk__check_dim(const char *op, const char *name, int64_t dim) {
  if (dim < 2 || dim % 2 || dim > (1 << 24))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is %lld, expected an even size >= 2", op, name,
                        (long long)dim);
  return FUSEDK_OK;
}

/* Flux's axes_dim[0..n) (as the attributes hold them): each an even size >= 2; *F (F may be NULL) =
   their columns, sum(axes_dim) / 2. */
static fusedk_status fusedk__check_axes(const char *op, const double *dims, int n, int64_t *F) {
  int64_t f = 0;
  for (int k = 0; k < n; ++k) {
    char name[24];
    snprintf(name, sizeof name, "axes_dim[%d]", k);
    fusedk_status st = fusedk__check_dim(op, name, (int64_t)dims[k]);
    if (st) return st;
    f += (int64_t)dims[k] / 2;
  }
  if (F) *F = f;
  return FUSEDK_OK;
}

/* rope_table_1d, rope_table_ltx: cos, sin [S, dim/2] */
static int fusedk__shape_table_dim(const fusedk_op *o, int out, const fusedk_tensor *like,
                                   const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)like, (void)t;
  if (fusedk__check_dim(o->name, "dim", (int64_t)a[0])) return -FUSEDK_ERR_INVALID_ARGUMENT;
  shape[1] = (int64_t)a[0] / 2;
  return 2;
}

/* rope_table_axes: cos, sin [S, sum(axes_dim) / 2], axes_dim 0-terminated in the attributes */
static int fusedk__shape_table_axes(const fusedk_op *o, int out, const fusedk_tensor *like,
                                    const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)like, (void)t;
  int n = 0;
  int64_t F = 0;
  while (n < 4 && a[1 + n] != 0.0) ++n;
  if (fusedk__check_axes(o->name, a + 1, n, &F)) return -FUSEDK_ERR_INVALID_ARGUMENT;
  shape[1] = F;
  return 2;
}

/* rope_table_mixed: cos, sin [S, H, F], freqs [3, H, F] */
static int fusedk__shape_table_mixed(const fusedk_op *o, int out, const fusedk_tensor *like,
                                     const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)like, (void)a;
  const fusedk_tensor *f = t[3];
  if (!f || f->ndim != 3 || !f->shape)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: freqs is missing or not [3, H, F]", o->name);
  shape[1] = f->shape[1], shape[2] = f->shape[2];
  return 3;
}

/* qk_norm_rope: each output its input's [B, S, H, Dh], or [B, H, S, Dh] for layout BHSD */
static int fusedk__shape_qk_norm_rope(const fusedk_op *o, int out, const fusedk_tensor *like,
                                      const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)t;
  char shp[160];
  if (like->ndim != 4)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected [B, S, H, Dh]", o->name,
                         o->tensors[o->tensors[out].like].name, fusedk__shape_str(like, shp, sizeof shp));
  if (a[3] != FUSEDK_LAYOUT_BHSD && a[3] != FUSEDK_LAYOUT_BSHD)
    return -fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: layout is %g, expected FUSEDK_LAYOUT_BHSD (0) or "
                         "FUSEDK_LAYOUT_BSHD (1)", o->name, a[3]);
  if (a[3] == FUSEDK_LAYOUT_BHSD) shape[1] = like->shape[2], shape[2] = like->shape[1];
  return 4;
}

/* qk_norm_rope_int8: the data its input's [B, S, H, Dh], the scales [B, S, H] */
static int fusedk__shape_qk_int8(const fusedk_op *o, int out, const fusedk_tensor *like,
                                 const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)t, (void)a, (void)shape;
  char shp[160];
  if (like->ndim != 4)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected [B, S, H, Dh]", o->name,
                         o->tensors[o->tensors[out].like].name, fusedk__shape_str(like, shp, sizeof shp));
  return out % 2 ? 3 : 4;
}

/* [linear] */

/* y and aux_out: x's rows (nd - 1 leading dims of `shape`) of N, the rows of w (named wn);
   nd = 1: db [N] */
static int fusedk__shape_rows_of_n(const fusedk_op *o, const fusedk_tensor *w, const char *wn, int nd,
                                   int64_t *shape) {
  char shp[160];
  if (!w || !w->shape || w->ndim < 1 || w->ndim > FUSEDK_MAX_DIMS)
    return -fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is missing, expected [N, K]", o->name, wn);
  if (w->ndim != 2)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected [N, K]", o->name, wn,
                         fusedk__shape_str(w, shp, sizeof shp));
  shape[nd - 1] = w->shape[0];
  return nd;
}

/* linear: y, aux_out [..., N] */
static int fusedk__shape_linear(const fusedk_op *o, int out, const fusedk_tensor *like,
                                const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)a;
  return fusedk__shape_rows_of_n(o, t[3], "w", like->ndim, shape);
}

/* linear_fp8: y, aux_out [..., N], N w's rows */
static int fusedk__shape_linear_fp8(const fusedk_op *o, int out, const fusedk_tensor *like,
                                    const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)a;
  return fusedk__shape_rows_of_n(o, t[4], "w", like->ndim, shape);
}

/* linear_backward: db [N] (dx and dw take x's and w's shapes) */
static int fusedk__shape_linear_backward(const fusedk_op *o, int out, const fusedk_tensor *like,
                                         const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)like, (void)a;
  return fusedk__shape_rows_of_n(o, t[5], "w", 1, shape);
}

/* [attention] */

/* attention: out q's shape, lse [B, Hq, Sq] */
static int fusedk__shape_attention(const fusedk_op *o, int out, const fusedk_tensor *like,
                                   const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)t, (void)a;
  char shp[160];
  if (like->ndim != 4)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: q has shape %s, expected [B, Sq, Hq, Dh]", o->name,
                         fusedk__shape_str(like, shp, sizeof shp));
  if (out != 1) return 4;
  shape[0] = like->shape[0], shape[1] = like->shape[2], shape[2] = like->shape[1];
  return 3;
}

/* attention_int8_scaled: out q's shape, lse [B, Hq, Sq] of q (tensor 2, the int8 data) */
static int fusedk__shape_attention_scaled(const fusedk_op *o, int out, const fusedk_tensor *like,
                                          const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)like;
  if (!t[2] || !t[2]->shape)
    return -fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: q is NULL, expected the int8 data", o->name);
  const int n = fusedk__shape_attention(o, out, t[2], t, a, shape);
  if (n == 4) memcpy(shape, t[2]->shape, 4 * sizeof *shape);
  return n;
}

/* [lowrank] */

/* lowrank_update: out, x's rows of K2 (u_t's columns) */
static int fusedk__shape_lowrank_update(const fusedk_op *o, int out, const fusedk_tensor *like,
                                        const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)a;
  const fusedk_tensor *u = t[4];
  char shp[160];
  if (!u || !u->shape || u->ndim < 1 || u->ndim > FUSEDK_MAX_DIMS)
    return -fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: u_t is missing, expected [r, K2]", o->name);
  if (u->ndim != 2)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: u_t has shape %s, expected [r, K2]", o->name,
                         fusedk__shape_str(u, shp, sizeof shp));
  shape[like->ndim - 1] = u->shape[1];
  return like->ndim;
}

/* lowrank_prepare: w_cat [N, K + A rp], rp = b's rank r rounded up to 8 */
static int fusedk__shape_lowrank_prepare(const fusedk_op *o, int out, const fusedk_tensor *like,
                                         const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)a;
  const fusedk_tensor *b = t[2];
  char shp[160];
  if (like->ndim != 2)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: w has shape %s, expected [N, K]", o->name,
                         fusedk__shape_str(like, shp, sizeof shp));
  if (!b || !b->shape || b->ndim < 1 || b->ndim > FUSEDK_MAX_DIMS)
    return -fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: b is missing, expected [N, r]", o->name);
  const int64_t A = b->ndim == 3 ? b->shape[0] : 1, r = b->shape[b->ndim - 1];
  if ((b->ndim != 2 && b->ndim != 3) || r < 1 || r > 128 || A < 1 || A > 128 || A * ((r + 7) / 8 * 8) > 128)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: b has shape %s, expected [N, r] or [A, N, r] with a rank r of "
                         "1..128 and A r (r rounded up to 8) at most 128", o->name, fusedk__shape_str(b, shp, sizeof shp));
  shape[1] = like->shape[1] + A * ((r + 7) / 8 * 8);
  return 2;
}

/* linear_lowrank: y, aux_out [..., N], N w_cat's rows */
static int fusedk__shape_linear_lowrank(const fusedk_op *o, int out, const fusedk_tensor *like,
                                        const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)out, (void)a;
  return fusedk__shape_rows_of_n(o, t[3], "w_cat", like->ndim, shape);
}

/* linear_lowrank_backward: db like b, [A,] N, r from a's [A,] r, K and w_cat's N; dbias [N] */
static int fusedk__shape_linear_lowrank_backward(const fusedk_op *o, int out, const fusedk_tensor *like,
                                                 const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  (void)a;
  const fusedk_tensor *w = t[7];
  const int nd = like->ndim;
  char shp[160];
  if (!w || !w->shape || w->ndim != 2)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: w_cat is missing or not [N, K + A rp]", o->name);
  if (out == 4) return shape[0] = w->shape[0], 1;
  if (nd != 2 && nd != 3)
    return -fusedk__fail(FUSEDK_ERR_SHAPE, "%s: a has shape %s, expected [r, K] or [A, r, K]", o->name,
                         fusedk__shape_str(like, shp, sizeof shp));
  shape[nd - 1] = like->shape[nd - 2], shape[nd - 2] = w->shape[0];
  return nd;
}

/* [conv] */

/* conv's geometry from x, w and the attributes (stride, pad, stride_t, pad_t, pad_t_back,
   replicate, act, upsample): a->N ... a->kw, stride and padding (what the registry's shape rule and the
   entry point both need; the rest of a untouched). */
static fusedk_status fusedk__conv_geometry(const char *op, const fusedk_tensor *x, const fusedk_tensor *w,
                                           const double *at, fusedk__conv_args *a) {
  char shp[160], wsh[160];
  if (x->ndim != 4 && x->ndim != 5)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: x has shape %s, expected [N, H, W, Ci] (NHWC) or [N, T, H, W, Ci] "
                        "(NDHWC)", op, fusedk__shape_str(x, shp, sizeof shp));
  if (!w || !w->shape || w->ndim != x->ndim || w->shape[w->ndim - 1] != x->shape[x->ndim - 1])
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: w has shape %s, expected [Co, %skh, kw, %lld] (x's channels last, "
                        "as x's %d dims)", op, w && w->shape ? fusedk__shape_str(w, wsh, sizeof wsh) : "(none)",
                        x->ndim == 5 ? "kt, " : "", (long long)x->shape[x->ndim - 1], (int)x->ndim);
  const int v = x->ndim == 5;
  for (int i = 0; i < 8; ++i) {
    static const char *names[] = {"stride", "padding", "stride_t", "pad_t", "pad_t_back", "replicate", "act",
                                  "upsample"};
    const double lo = i == 0 || i == 2 || i == 7 ? 1 : 0;
    const double hi = i == 5 ? 3 : i == 6 ? FUSEDK_ACT_NONE : i == 7 ? 16 : 1 << 20;
    if (!(at[i] >= lo && at[i] <= hi) || at[i] != (double)(int64_t)at[i])
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is %g, expected an integer in %g..%g", op, names[i],
                          at[i], lo, hi);
    const int time_set = i == 5 ? ((int64_t)at[i] & 1) != 0 : at[i] != (i == 2); /* replicate: its time bit */
    if (!v && i >= 2 && i <= 5 && time_set)
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is %g for an image (x [N, H, W, Ci]), expected %s: "
                          "the time attributes are a video's (x [N, T, H, W, Ci])", op, names[i], at[i],
                          i == 5 ? "0 or 2" : i == 2 ? "1" : "0");
  }
  a->stride = (int32_t)at[0], a->pad = (int32_t)at[1], a->stride_t = (int32_t)at[2], a->pad_t = (int32_t)at[3];
  a->replicate = (int32_t)at[5], a->act = (int32_t)at[6], a->up = (int32_t)at[7];
  a->N = x->shape[0], a->T = v ? x->shape[1] : 1, a->H = x->shape[1 + v] * a->up, a->W = x->shape[2 + v] * a->up;
  a->Ci = x->shape[3 + v], a->Co = w->shape[0];
  a->kt = v ? w->shape[1] : 1, a->kh = w->shape[1 + v], a->kw = w->shape[2 + v];
  if (a->Co < 1 || a->kt < 1 || a->kh < 1 || a->kw < 1)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: w has shape %s, expected sizes >= 1 but Ci's", op,
                        fusedk__shape_str(w, wsh, sizeof wsh));
  const int64_t pt = a->pad_t + (int64_t)at[4], t = a->T + pt, h = a->H + 2 * (int64_t)a->pad,
                wd = a->W + 2 * (int64_t)a->pad;
  if ((a->T && t < a->kt) || (a->H && h < a->kh) || (a->W && wd < a->kw))
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: x has shape %s and w %s: the kernel is larger than the padded "
                        "input (T + pad_t + pad_t_back, H + 2 padding, W + 2 padding)", op, fusedk__shape_str(x, shp, sizeof shp),
                        fusedk__shape_str(w, wsh, sizeof wsh));
  a->To = a->T ? (t - a->kt) / a->stride_t + 1 : 0, a->Ho = a->H ? (h - a->kh) / a->stride + 1 : 0;
  a->Wo = a->W ? (wd - a->kw) / a->stride + 1 : 0;
  return FUSEDK_OK;
}

/* conv: out [N, (To,) Ho, Wo, Co] */
static int fusedk__shape_conv(const fusedk_op *o, int out, const fusedk_tensor *like, const fusedk_tensor *const *t,
                              const double *a, int64_t *shape) {
  (void)out;
  fusedk__conv_args g;
  fusedk_status st = fusedk__conv_geometry(o->name, like, t[2], a, &g);
  if (st) return -(int)st;
  const int v = like->ndim == 5;
  if (v) shape[1] = g.To;
  shape[1 + v] = g.Ho, shape[2 + v] = g.Wo, shape[3 + v] = g.Co;
  return like->ndim;
}

#define FUSEDK__IN(n, role) {n, FUSEDK_ARG_IN, -1, -1, role, -1}
#define FUSEDK__OPT(n, role) {n, FUSEDK_ARG_IN_OPT, -1, -1, role, -1}
#define FUSEDK__OUT(n, like) {n, FUSEDK_ARG_OUT, like, -1, FUSEDK_ROLE_ROW, -1}
#define FUSEDK__F32_IN(n) {n, FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_F32}
#define FUSEDK__MOD_IN(n) {n, FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_SAMPLE, -2} /* x's dtype or float32 */
#define FUSEDK__TABLE(n, like) {n, FUSEDK_ARG_OUT, like, -1, FUSEDK_ROLE_OWN, FUSEDK_F32}
#define FUSEDK__OWN_OUT(n, like, when) {n, (when) == -1 ? FUSEDK_ARG_OUT : FUSEDK_ARG_OUT_OPT, like, when, FUSEDK_ROLE_OWN, -1}
#define FUSEDK__EPS(v) {"eps", FUSEDK_ATTR_F32, v}
#define FUSEDK__I32(n, v) {n, FUSEDK_ATTR_I32, v}
#define FUSEDK__FLT(n, v) {n, FUSEDK_ATTR_F32, v}
#define FUSEDK__NO_ATTR {NULL, 0, 0.0}
#define FUSEDK__ROW FUSEDK_ROLE_ROW
#define FUSEDK__COL FUSEDK_ROLE_COLUMN
#define FUSEDK__SMP FUSEDK_ROLE_SAMPLE

/* Each op: its public description and the shape rule of its outputs of role OWN (NULL where it
   has none), one entry an op in fusedk_op_id order. */
typedef struct fusedk__entry {
  fusedk_op op;
  fusedk__shape_rule out_shape;
} fusedk__entry;
static const fusedk__entry fusedk__registry[FUSEDK_OP_COUNT] = {
    {{"rmsnorm", 5, 1, 0,
      {FUSEDK__OUT("y", 2), {"residual_out", FUSEDK_ARG_OUT_OPT, 2, 3, FUSEDK__ROW, -1}, FUSEDK__IN("x", FUSEDK__ROW),
       FUSEDK__OPT("residual", FUSEDK__ROW), FUSEDK__OPT("weight", FUSEDK__COL)},
      {FUSEDK__EPS(1e-6)}}, NULL},
    {{"layernorm", 4, 1, 0,
      {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__OPT("weight", FUSEDK__COL),
       FUSEDK__OPT("bias", FUSEDK__COL)},
      {FUSEDK__EPS(1e-5)}}, NULL},
    {{"adaln", 6, 2, 3,
      {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__MOD_IN("scale"), FUSEDK__MOD_IN("shift"),
       FUSEDK__OPT("weight", FUSEDK__COL), FUSEDK__OPT("bias", FUSEDK__COL)},
      {{"norm", FUSEDK_ATTR_I32, FUSEDK_NORM_LAYER}, FUSEDK__EPS(1e-6)}}, NULL},
    {{"residual_tanh_gated_rmsnorm", 4, 2, 3,
      {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__IN("x_res", FUSEDK__ROW),
       FUSEDK__IN("gate", FUSEDK__SMP)},
      {FUSEDK__EPS(1e-6), {"exact", FUSEDK_ATTR_I32, 1}}}, NULL},
    {{"act", 2, 1, 0, {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW)}, {{"kind", FUSEDK_ATTR_I32, FUSEDK_ACT_GELU}}},
     NULL},
    {{"silu_fma", 4, 0, 0,
      {FUSEDK__OUT("y", 1), FUSEDK__IN("a", FUSEDK__ROW), FUSEDK__IN("b", FUSEDK__ROW), FUSEDK__IN("c", FUSEDK__ROW)},
      {FUSEDK__NO_ATTR}}, NULL},
    {{"gated_residual", 4, 0, 3,
      {FUSEDK__OUT("out", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__IN("y", FUSEDK__ROW), FUSEDK__MOD_IN("gate")},
      {FUSEDK__NO_ATTR}}, NULL},
    {{"glu", 2, 2, 0, {{"y", FUSEDK_ARG_OUT, 1, -1, FUSEDK_ROLE_ROW_HALF, -1}, FUSEDK__IN("x", FUSEDK__ROW)},
      {{"act", FUSEDK_ATTR_I32, FUSEDK_ACT_SILU}, {"act_half", FUSEDK_ATTR_I32, FUSEDK_GLU_FIRST}}}, NULL},
    {{"glu_pair", 3, 1, 0, {FUSEDK__OUT("y", 1), FUSEDK__IN("value", FUSEDK__ROW), FUSEDK__IN("gate", FUSEDK__ROW)},
      {{"act", FUSEDK_ATTR_I32, FUSEDK_ACT_SILU}}}, NULL},
    {{"rope", 6, 2, 4,
      {FUSEDK__OUT("q_out", 2), {"k_out", FUSEDK_ARG_OUT_OPT, 3, 3, FUSEDK__ROW, -1}, FUSEDK__IN("q", FUSEDK__ROW),
       FUSEDK__OPT("k", FUSEDK_ROLE_OWN), FUSEDK__F32_IN("cos"), FUSEDK__F32_IN("sin")},
      {FUSEDK__I32("style", FUSEDK_ROPE_INTERLEAVED), FUSEDK__I32("rotary_dim", 0)}}, NULL},
    {{"rope_table_1d", 3, 2, -1, {FUSEDK__TABLE("cos", 2), FUSEDK__TABLE("sin", 2), FUSEDK__F32_IN("positions")},
      {FUSEDK__I32("dim", 0), FUSEDK__FLT("theta", 10000.0)}}, fusedk__shape_table_dim},
    {{"rope_table_axes", 3, 5, -1, {FUSEDK__TABLE("cos", 2), FUSEDK__TABLE("sin", 2), FUSEDK__F32_IN("ids")},
      {FUSEDK__FLT("theta", 10000.0), FUSEDK__I32("axes_dim0", 16), FUSEDK__I32("axes_dim1", 56),
       FUSEDK__I32("axes_dim2", 56), FUSEDK__I32("axes_dim3", 0)}}, fusedk__shape_table_axes},
    {{"rope_table_ltx", 3, 2, -1, {FUSEDK__TABLE("cos", 2), FUSEDK__TABLE("sin", 2), FUSEDK__F32_IN("coords")},
      {FUSEDK__I32("dim", 0), FUSEDK__FLT("theta", 10000.0)}}, fusedk__shape_table_dim},
    {{"rope_table_mixed", 4, 0, -1,
      {FUSEDK__TABLE("cos", 2), FUSEDK__TABLE("sin", 2), FUSEDK__F32_IN("pos"), FUSEDK__F32_IN("freqs")},
      {FUSEDK__NO_ATTR}}, fusedk__shape_table_mixed},
    {{"diffusion_step", 5, 8, 0,
      {FUSEDK__OUT("out", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__IN("cond", FUSEDK__ROW),
       FUSEDK__OPT("uncond", FUSEDK__ROW), FUSEDK__OPT("prev", FUSEDK__ROW)},
      {FUSEDK__FLT("guidance", 1.0), FUSEDK__I32("sampler", FUSEDK_SAMPLER_EULER), FUSEDK__FLT("sigma", 0.0),
       FUSEDK__FLT("sigma_next", 0.0), FUSEDK__FLT("alpha_bar", 1.0), FUSEDK__FLT("alpha_bar_prev", 1.0),
       FUSEDK__FLT("clamp_x0", 0.0), FUSEDK__FLT("blend", 1.0)}}, NULL},
    {{"qk_norm_rope", 10, 5, 4,
      {FUSEDK__OWN_OUT("q_out", 3, -1), FUSEDK__OWN_OUT("k_out", 4, -1), FUSEDK__OWN_OUT("v_out", 5, 5),
       FUSEDK__IN("q", FUSEDK__ROW), FUSEDK__IN("k", FUSEDK_ROLE_OWN), FUSEDK__OPT("v", FUSEDK_ROLE_OWN),
       FUSEDK__F32_IN("cos"), FUSEDK__F32_IN("sin"), FUSEDK__OPT("q_weight", FUSEDK_ROLE_OWN),
       FUSEDK__OPT("k_weight", FUSEDK_ROLE_OWN)},
      {FUSEDK__EPS(1e-6), FUSEDK__I32("norm", FUSEDK_QK_NORM_HEAD), FUSEDK__I32("style", FUSEDK_ROPE_INTERLEAVED),
       FUSEDK__I32("layout", FUSEDK_LAYOUT_BHSD), FUSEDK__I32("rotary_dim", 0)}}, fusedk__shape_qk_norm_rope},
    /* [linear]: the optional outputs exist when their attribute asks (when = -2 - attribute) */
    {{"linear", 5, 3, -1,
      {FUSEDK__OWN_OUT("y", 2, -1), FUSEDK__OWN_OUT("aux_out", 2, -2 - 2), FUSEDK__IN("x", FUSEDK_ROLE_OWN),
       FUSEDK__IN("w", FUSEDK_ROLE_OWN), FUSEDK__OPT("bias", FUSEDK_ROLE_OWN)},
      {FUSEDK__I32("act", FUSEDK_ACT_NONE), FUSEDK__I32("tf32", 0), FUSEDK__I32("want_aux", 0)}}, fusedk__shape_linear},
    {{"linear_backward", 7, 5, -1,
      {{"dx", FUSEDK_ARG_OUT_OPT, 4, -2 - 2, FUSEDK__ROW, -1}, {"dw", FUSEDK_ARG_OUT_OPT, 5, -2 - 3, FUSEDK__ROW, -1},
       FUSEDK__OWN_OUT("db", 5, -2 - 4), FUSEDK__IN("dy", FUSEDK_ROLE_OWN), FUSEDK__IN("x", FUSEDK_ROLE_OWN),
       FUSEDK__IN("w", FUSEDK_ROLE_OWN), FUSEDK__OPT("aux", FUSEDK_ROLE_OWN)},
      {FUSEDK__I32("act", FUSEDK_ACT_NONE), FUSEDK__I32("tf32", 0), FUSEDK__I32("want_dx", 1),
       FUSEDK__I32("want_dw", 1), FUSEDK__I32("want_db", 1)}}, fusedk__shape_linear_backward},
    /* [attention]: lse exists when want_lse asks */
    {{"attention", 6, 3, 4,
      {FUSEDK__OWN_OUT("out", 2, -1), {"lse", FUSEDK_ARG_OUT_OPT, 2, -2 - 2, FUSEDK_ROLE_OWN, FUSEDK_F32},
       FUSEDK__IN("q", FUSEDK__ROW), FUSEDK__IN("k", FUSEDK_ROLE_OWN), FUSEDK__IN("v", FUSEDK_ROLE_OWN),
       {"kv_len", FUSEDK_ARG_IN_OPT, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_I32}},
      {FUSEDK__FLT("scale", 0.0), FUSEDK__I32("causal", 0), FUSEDK__I32("want_lse", 0)}}, fusedk__shape_attention},
    /* [lowrank]: out takes x's leading dims and u_t's columns; y, when given, is what it adds to */
    {{"lowrank_update", 6, 2, -1,
      {FUSEDK__OWN_OUT("out", 1, -1), FUSEDK__IN("x", FUSEDK_ROLE_OWN), FUSEDK__IN("v", FUSEDK_ROLE_OWN),
       FUSEDK__OPT("codes", FUSEDK_ROLE_OWN), FUSEDK__IN("u_t", FUSEDK_ROLE_OWN), FUSEDK__OPT("y", FUSEDK_ROLE_OWN)},
      {FUSEDK__FLT("scaling", 1.0), FUSEDK__FLT("beta", 1.0)}}, fusedk__shape_lowrank_update},
    /* w_cat: [N, K + A rp] (w's rows, each adapter's b columns rounded up to 8 after them) */
    {{"lowrank_prepare", 3, 1, -1,
      {FUSEDK__OWN_OUT("w_cat", 1, -1), FUSEDK__IN("w", FUSEDK_ROLE_OWN), FUSEDK__IN("b", FUSEDK_ROLE_OWN)},
      {FUSEDK__FLT("scaling", 1.0)}}, fusedk__shape_lowrank_prepare},
    /* y, aux_out: x's rows of N (w_cat's rows); aux_out exists when want_aux asks */
    {{"linear_lowrank", 8, 2, -1,
      {FUSEDK__OWN_OUT("y", 2, -1), FUSEDK__OWN_OUT("aux_out", 2, -2 - 1), FUSEDK__IN("x", FUSEDK_ROLE_OWN),
       FUSEDK__IN("w_cat", FUSEDK_ROLE_OWN), FUSEDK__OPT("bias", FUSEDK_ROLE_OWN), FUSEDK__IN("a", FUSEDK_ROLE_OWN),
       FUSEDK__OPT("codes", FUSEDK_ROLE_OWN), {"adapter_ids", FUSEDK_ARG_IN_OPT, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_I32}},
      {FUSEDK__I32("act", FUSEDK_ACT_NONE), FUSEDK__I32("want_aux", 0)}}, fusedk__shape_linear_lowrank},
    /* the gradients: each like its input, when its want_ attribute asks; dcodes when codes is given */
    {{"lowrank_update_backward", 9, 4, -1,
      {{"dx", FUSEDK_ARG_OUT_OPT, 5, -2 - 1, FUSEDK__ROW, -1}, {"dv", FUSEDK_ARG_OUT_OPT, 6, -2 - 2, FUSEDK__ROW, -1},
       {"du_t", FUSEDK_ARG_OUT_OPT, 8, -2 - 3, FUSEDK__ROW, -1}, {"dcodes", FUSEDK_ARG_OUT_OPT, 7, 7, FUSEDK__ROW, -1},
       FUSEDK__IN("dout", FUSEDK_ROLE_OWN), FUSEDK__IN("x", FUSEDK_ROLE_OWN), FUSEDK__IN("v", FUSEDK_ROLE_OWN),
       FUSEDK__OPT("codes", FUSEDK_ROLE_OWN), FUSEDK__IN("u_t", FUSEDK_ROLE_OWN)},
      {FUSEDK__FLT("scaling", 1.0), FUSEDK__I32("want_dx", 1), FUSEDK__I32("want_dv", 1), FUSEDK__I32("want_du_t", 1)}},
     NULL},
    /* db: b's shape ([A,] N, r: a's with w_cat's N), dbias: [N] */
    {{"linear_lowrank_backward", 12, 6, -1,
      {{"dx", FUSEDK_ARG_OUT_OPT, 6, -2 - 2, FUSEDK__ROW, -1}, {"da", FUSEDK_ARG_OUT_OPT, 8, -2 - 3, FUSEDK__ROW, -1},
       FUSEDK__OWN_OUT("db", 8, -2 - 4), {"dcodes", FUSEDK_ARG_OUT_OPT, 9, 9, FUSEDK__ROW, -1},
       FUSEDK__OWN_OUT("dbias", 7, -2 - 5), FUSEDK__IN("dy", FUSEDK_ROLE_OWN), FUSEDK__IN("x", FUSEDK_ROLE_OWN),
       FUSEDK__IN("w_cat", FUSEDK_ROLE_OWN), FUSEDK__IN("a", FUSEDK_ROLE_OWN), FUSEDK__OPT("codes", FUSEDK_ROLE_OWN),
       {"adapter_ids", FUSEDK_ARG_IN_OPT, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_I32}, FUSEDK__OPT("aux", FUSEDK_ROLE_OWN)},
      {FUSEDK__I32("act", FUSEDK_ACT_NONE), FUSEDK__FLT("scaling", 1.0), FUSEDK__I32("want_dx", 1),
       FUSEDK__I32("want_da", 1), FUSEDK__I32("want_db", 1), FUSEDK__I32("want_dbias", 0)}},
     fusedk__shape_linear_lowrank_backward},
    /* [attention] (an id of its own, after the ops before it): attention's arguments */
    {{"attention_int8", 6, 3, 4,
      {FUSEDK__OWN_OUT("out", 2, -1), {"lse", FUSEDK_ARG_OUT_OPT, 2, -2 - 2, FUSEDK_ROLE_OWN, FUSEDK_F32},
       FUSEDK__IN("q", FUSEDK__ROW), FUSEDK__IN("k", FUSEDK_ROLE_OWN), FUSEDK__IN("v", FUSEDK_ROLE_OWN),
       {"kv_len", FUSEDK_ARG_IN_OPT, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_I32}},
      {FUSEDK__FLT("scale", 0.0), FUSEDK__I32("causal", 0), FUSEDK__I32("want_lse", 0)}}, fusedk__shape_attention},
    /* q, k: the scaled tensors' parts (data int8, scale float32); v the reference (the call's
       dtype: the first input that has it); out takes v's dtype, q's shape */
    {{"attention_int8_scaled", 8, 3, 4,
      {FUSEDK__OWN_OUT("out", 6, -1), {"lse", FUSEDK_ARG_OUT_OPT, 6, -2 - 2, FUSEDK_ROLE_OWN, FUSEDK_F32},
       {"q", FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_I8}, FUSEDK__F32_IN("q_scale"),
       {"k", FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_I8}, FUSEDK__F32_IN("k_scale"),
       FUSEDK__IN("v", FUSEDK__ROW), {"kv_len", FUSEDK_ARG_IN_OPT, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_I32}},
      {FUSEDK__FLT("scale", 0.0), FUSEDK__I32("causal", 0), FUSEDK__I32("want_lse", 0)}},
     fusedk__shape_attention_scaled},
    /* [position] (after the ops before it): q' and k' as scaled tensors, each data (int8, its
       input's shape) and scale (float32 [B, S, H]) */
    {{"qk_norm_rope_int8", 10, 4, 4,
      {{"q_out", FUSEDK_ARG_OUT, 4, -1, FUSEDK_ROLE_OWN, FUSEDK_I8},
       {"q_out_scale", FUSEDK_ARG_OUT, 4, -1, FUSEDK_ROLE_OWN, FUSEDK_F32},
       {"k_out", FUSEDK_ARG_OUT, 5, -1, FUSEDK_ROLE_OWN, FUSEDK_I8},
       {"k_out_scale", FUSEDK_ARG_OUT, 5, -1, FUSEDK_ROLE_OWN, FUSEDK_F32}, FUSEDK__IN("q", FUSEDK__ROW),
       FUSEDK__IN("k", FUSEDK_ROLE_OWN), FUSEDK__F32_IN("cos"), FUSEDK__F32_IN("sin"),
       FUSEDK__OPT("q_weight", FUSEDK_ROLE_OWN), FUSEDK__OPT("k_weight", FUSEDK_ROLE_OWN)},
      {FUSEDK__EPS(1e-6), FUSEDK__I32("norm", FUSEDK_QK_NORM_HEAD), FUSEDK__I32("style", FUSEDK_ROPE_INTERLEAVED),
       FUSEDK__I32("rotary_dim", 0)}}, fusedk__shape_qk_int8},
    /* [linear] (after the ops before it): FP8. The scaled tensors' parts: data e4m3, scale float32
       [...] (a row scale of the data); outputs of scalar -3 take the out_dtype attribute's dtype */
    {{"quantize_fp8", 3, 0, 0,
      {{"out", FUSEDK_ARG_OUT, 2, -1, FUSEDK__ROW, FUSEDK_E4M3},
       {"out_scale", FUSEDK_ARG_OUT, 2, -1, FUSEDK_ROLE_ROW_SCALE, FUSEDK_F32}, FUSEDK__IN("x", FUSEDK__ROW)},
      {FUSEDK__NO_ATTR}}, NULL},
    {{"dequantize_fp8", 3, 1, 0,
      {{"y", FUSEDK_ARG_OUT, 1, -1, FUSEDK__ROW, -3}, {"x", FUSEDK_ARG_IN, -1, -1, FUSEDK__ROW, FUSEDK_E4M3},
       {"x_scale", FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_ROW_SCALE, FUSEDK_F32}},
      {FUSEDK__I32("out_dtype", FUSEDK_BF16)}}, NULL},
    {{"linear_fp8", 7, 4, -1,
      {{"y", FUSEDK_ARG_OUT, 2, -1, FUSEDK_ROLE_OWN, -3}, {"aux_out", FUSEDK_ARG_OUT_OPT, 2, -2 - 1, FUSEDK_ROLE_OWN, -3},
       {"x", FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_E4M3},
       {"x_scale", FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_ROW_SCALE, FUSEDK_F32},
       {"w", FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_E4M3}, FUSEDK__F32_IN("w_scale"),
       {"bias", FUSEDK_ARG_IN_OPT, -1, -1, FUSEDK_ROLE_OWN, -3}},
      {FUSEDK__I32("act", FUSEDK_ACT_NONE), FUSEDK__I32("want_aux", 0), FUSEDK__I32("out_dtype", FUSEDK_BF16),
       FUSEDK__I32("fast_accum", 1)}},
     fusedk__shape_linear_fp8},
    /* [norm] (after the ops before it): y as a scaled e4m3 tensor, data and scale */
    {{"rmsnorm_fp8", 6, 1, 0,
      {{"y", FUSEDK_ARG_OUT, 3, -1, FUSEDK__ROW, FUSEDK_E4M3}, {"y_scale", FUSEDK_ARG_OUT, 3, -1, FUSEDK_ROLE_ROW_SCALE, FUSEDK_F32},
       {"residual_out", FUSEDK_ARG_OUT_OPT, 3, 4, FUSEDK__ROW, -1}, FUSEDK__IN("x", FUSEDK__ROW),
       FUSEDK__OPT("residual", FUSEDK__ROW), FUSEDK__OPT("weight", FUSEDK__COL)},
      {FUSEDK__EPS(1e-6)}}, NULL},
    {{"layernorm_fp8", 5, 1, 0,
      {{"y", FUSEDK_ARG_OUT, 2, -1, FUSEDK__ROW, FUSEDK_E4M3}, {"y_scale", FUSEDK_ARG_OUT, 2, -1, FUSEDK_ROLE_ROW_SCALE, FUSEDK_F32},
       FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__OPT("weight", FUSEDK__COL), FUSEDK__OPT("bias", FUSEDK__COL)},
      {FUSEDK__EPS(1e-5)}}, NULL},
    {{"adaln_fp8", 7, 2, 3,
      {{"y", FUSEDK_ARG_OUT, 2, -1, FUSEDK__ROW, FUSEDK_E4M3}, {"y_scale", FUSEDK_ARG_OUT, 2, -1, FUSEDK_ROLE_ROW_SCALE, FUSEDK_F32},
       FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__MOD_IN("scale"), FUSEDK__MOD_IN("shift"),
       FUSEDK__OPT("weight", FUSEDK__COL), FUSEDK__OPT("bias", FUSEDK__COL)},
      {{"norm", FUSEDK_ATTR_I32, FUSEDK_NORM_LAYER}, FUSEDK__EPS(1e-6)}}, NULL},
    /* [linear] (after the ops before it): glu's y as a scaled e4m3 tensor */
    {{"glu_fp8", 3, 2, 0,
      {{"out", FUSEDK_ARG_OUT, 2, -1, FUSEDK_ROLE_ROW_HALF, FUSEDK_E4M3},
       {"out_scale", FUSEDK_ARG_OUT, 2, -1, FUSEDK_ROLE_ROW_SCALE, FUSEDK_F32}, FUSEDK__IN("x", FUSEDK__ROW)},
      {{"act", FUSEDK_ATTR_I32, FUSEDK_ACT_SILU}, {"act_half", FUSEDK_ATTR_I32, FUSEDK_GLU_FIRST}}}, NULL},
    /* [linear] (after the ops before it): int8 weights, data and scale; y takes x's dtype */
    {{"quantize_int8", 3, 0, 0,
      {{"out", FUSEDK_ARG_OUT, 2, -1, FUSEDK__ROW, FUSEDK_I8},
       {"out_scale", FUSEDK_ARG_OUT, 2, -1, FUSEDK_ROLE_ROW_SCALE, FUSEDK_F32}, FUSEDK__IN("x", FUSEDK__ROW)},
      {FUSEDK__NO_ATTR}}, NULL},
    {{"linear_w8", 6, 2, -1,
      {FUSEDK__OWN_OUT("y", 2, -1), FUSEDK__OWN_OUT("aux_out", 2, -2 - 1), FUSEDK__IN("x", FUSEDK_ROLE_OWN),
       {"w", FUSEDK_ARG_IN, -1, -1, FUSEDK_ROLE_OWN, FUSEDK_I8}, FUSEDK__F32_IN("w_scale"),
       FUSEDK__OPT("bias", FUSEDK_ROLE_OWN)},
      {FUSEDK__I32("act", FUSEDK_ACT_NONE), FUSEDK__I32("want_aux", 0)}}, fusedk__shape_linear},
    /* [conv] (after the ops before it) */
    {{"conv", 5, 8, -1,
      {FUSEDK__OWN_OUT("out", 1, -1), FUSEDK__IN("x", FUSEDK_ROLE_OWN), FUSEDK__IN("w", FUSEDK_ROLE_OWN),
       FUSEDK__OPT("bias", FUSEDK_ROLE_OWN), FUSEDK__OPT("residual", FUSEDK_ROLE_OWN)},
      {FUSEDK__I32("stride", 1), FUSEDK__I32("padding", 0), FUSEDK__I32("stride_t", 1), FUSEDK__I32("pad_t", 0),
       FUSEDK__I32("pad_t_back", 0), FUSEDK__I32("replicate", 0), FUSEDK__I32("act", FUSEDK_ACT_NONE),
       FUSEDK__I32("upsample", 1)}},
     fusedk__shape_conv},
    /* w_out like w, b_out like mean ([Co]) */
    {{"fold_batchnorm", 8, 1, -1,
      {FUSEDK__OUT("w_out", 2), FUSEDK__OUT("b_out", 6), FUSEDK__IN("w", FUSEDK_ROLE_OWN),
       FUSEDK__OPT("bias", FUSEDK_ROLE_OWN), FUSEDK__OPT("gamma", FUSEDK_ROLE_OWN), FUSEDK__OPT("beta", FUSEDK_ROLE_OWN),
       FUSEDK__IN("mean", FUSEDK_ROLE_OWN), FUSEDK__IN("var", FUSEDK_ROLE_OWN)},
      {FUSEDK__EPS(1e-5)}}, NULL},
    {{"group_norm", 6, 3, -1,
      {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__OPT("weight", FUSEDK__COL),
       FUSEDK__OPT("bias", FUSEDK__COL), FUSEDK__OPT("scale", FUSEDK_ROLE_OWN), FUSEDK__OPT("shift", FUSEDK_ROLE_OWN)},
      {FUSEDK__I32("groups", 32), FUSEDK__EPS(1e-6), FUSEDK__I32("act", FUSEDK_ACT_NONE)}}, NULL},
    {{"channel_rmsnorm", 6, 3, 0,
      {FUSEDK__OUT("y", 1), FUSEDK__IN("x", FUSEDK__ROW), FUSEDK__OPT("weight", FUSEDK__COL),
       FUSEDK__OPT("bias", FUSEDK__COL), FUSEDK__OPT("scale", FUSEDK_ROLE_OWN), FUSEDK__OPT("shift", FUSEDK_ROLE_OWN)},
      {FUSEDK__EPS(1e-6), FUSEDK__I32("clamp", 0), FUSEDK__I32("act", FUSEDK_ACT_NONE)}}, NULL},
};
#undef FUSEDK__IN
#undef FUSEDK__OPT
#undef FUSEDK__OUT
#undef FUSEDK__EPS
#undef FUSEDK__F32_IN
#undef FUSEDK__TABLE
#undef FUSEDK__OWN_OUT
#undef FUSEDK__I32
#undef FUSEDK__FLT
#undef FUSEDK__NO_ATTR
#undef FUSEDK__ROW
#undef FUSEDK__COL
#undef FUSEDK__SMP

/* Op i's public description (i a valid fusedk_op_id). */
static const fusedk_op *fusedk__op(int32_t i) { return &fusedk__registry[i].op; }

/* The integer attributes of a registry call: cast to int only what is one. */
static fusedk_status fusedk__check_int_attrs(const fusedk_op *o, const double *a) {
  for (int k = 0; k < o->n_attrs; ++k)
    if (o->attrs[k].type == FUSEDK_ATTR_I32 && !(a[k] >= -2147483648.0 && a[k] <= 2147483647.0 && a[k] == floor(a[k])))
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: attribute %s is %g, expected an integer", o->name,
                          o->attrs[k].name, a[k]);
  return FUSEDK_OK;
}

/* Output i's shape: its like input's (half its last dim for ROW_HALF), else (role OWN) the op's
   rule; the ndim, or a negative status. */
static int fusedk__out_shape(int32_t id, int i, const fusedk_tensor *const *t, const double *a, int64_t *shape) {
  const fusedk_op *o = fusedk__op(id);
  const fusedk_status ast = fusedk__check_int_attrs(o, a);
  if (ast) return -(int)ast;
  const fusedk_op_tensor *r = &o->tensors[i];
  const fusedk_tensor *like = r->like >= 0 ? t[r->like] : NULL;
  if (!like || like->ndim < 1 || like->ndim > FUSEDK_MAX_DIMS || !like->shape)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s takes its shape from %s, expected a tensor of ndim "
                        "1..%d there", o->name, r->name, r->like >= 0 ? o->tensors[r->like].name : "an input",
                        FUSEDK_MAX_DIMS), -FUSEDK_ERR_INVALID_ARGUMENT;
  const int nd = like->ndim;
  memcpy(shape, like->shape, (size_t)nd * sizeof *shape);
  if (r->role == FUSEDK_ROLE_ROW_HALF) shape[nd - 1] /= 2;
  if (r->role == FUSEDK_ROLE_ROW_SCALE) return nd > 1 ? nd - 1 : (shape[0] = 1, 1);
  if (r->role != FUSEDK_ROLE_OWN) return nd;
  if (!fusedk__registry[id].out_shape)
    return -fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: %s has no shape rule in the registry", o->name, r->name);
  return fusedk__registry[id].out_shape(o, i, like, t, a, shape);
}

FUSEDK_DEF int32_t fusedk_op_out_shape(int32_t i, int32_t out, const fusedk_tensor *const *t, const double *a,
                                       int64_t *shape) {
  if (i < 0 || i >= FUSEDK_OP_COUNT || !t || !a || !shape || out < 0 || out >= fusedk__op(i)->n_tensors ||
      fusedk__op(i)->tensors[out].kind < FUSEDK_ARG_OUT)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "op_out_shape: op %d, tensor %d is not an output", (int)i,
                        (int)out), -FUSEDK_ERR_INVALID_ARGUMENT;
  return fusedk__out_shape(i, out, t, a, shape);
}

/* v names a float dtype fusedk computes in (what an out_dtype attribute takes) */
static int fusedk__float_scalar(double v) { return v == FUSEDK_F32 || v == FUSEDK_F16 || v == FUSEDK_BF16; }

/* The attribute that names the dtype of an op's tensors of scalar -3 (out_dtype), or -1 */
static int fusedk__out_dtype_attr(const fusedk_op *o) {
  for (int k = 0; k < o->n_attrs; ++k)
    if (!strcmp(o->attrs[k].name, "out_dtype")) return k;
  return -1;
}

FUSEDK_DEF int32_t fusedk_op_out_scalar(int32_t i, int32_t out, const double *a) {
  if (i < 0 || i >= FUSEDK_OP_COUNT || out < 0 || out >= fusedk__op(i)->n_tensors) return -1;
  const int32_t sc = fusedk__op(i)->tensors[out].scalar, k = fusedk__out_dtype_attr(fusedk__op(i));
  if (sc >= 0) return sc;
  if (sc != -3 || k < 0 || !a) return -1;
  const double v = a[k]; /* a float dtype's value, or -1 (op_call then names the attribute) */
  return fusedk__float_scalar(v) ? (int32_t)v : -1;
}

/* The out_dtype attribute (a float dtype) and the tensors it names, which must have it */
static fusedk_status fusedk__check_out_dtype(const fusedk_op *o, const fusedk_tensor *const *t, const double *a) {
  const int k = fusedk__out_dtype_attr(o);
  if (k < 0) return FUSEDK_OK;
  const int want = (int)a[k];
  if (!fusedk__float_scalar(a[k]))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: out_dtype is %d, expected FUSEDK_F32 (0), FUSEDK_F16 (1) or "
                        "FUSEDK_BF16 (2)", o->name, want);
  for (int i = 0; i < o->n_tensors; ++i) {
    const int got = t[i] ? fusedk__scalar_of(t[i]->dtype) : want;
    if (o->tensors[i].scalar == -3 && got >= 0 && got != want)
      return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected %s (out_dtype)", o->name,
                          o->tensors[i].name, fusedk__scalar_name(got), fusedk__scalar_name(want));
  }
  return FUSEDK_OK;
}

FUSEDK_DEF int32_t fusedk_op_out_exists(int32_t i, int32_t out, const fusedk_tensor *const *t, const double *a) {
  if (i < 0 || i >= FUSEDK_OP_COUNT || out < 0 || out >= fusedk__op(i)->n_tensors) return 0;
  const fusedk_op_tensor *r = &fusedk__op(i)->tensors[out];
  if (r->kind == FUSEDK_ARG_OUT) return 1;
  if (r->kind != FUSEDK_ARG_OUT_OPT) return 0;
  if (r->when >= 0) return t && t[r->when] != NULL;
  return a && a[-2 - r->when] != 0.0;
}

FUSEDK_DEF const fusedk_op *fusedk_op_get(int32_t i) {
  return i >= 0 && i < FUSEDK_OP_COUNT ? fusedk__op(i) : NULL;
}

FUSEDK_DEF int32_t fusedk_op_find(const char *name) {
  for (int32_t i = 0; name && i < FUSEDK_OP_COUNT; ++i)
    if (!strcmp(fusedk__op(i)->name, name)) return i;
  return -1;
}

FUSEDK_DEF fusedk_status fusedk_op_call(int32_t i, const fusedk_tensor *const *t, const double *a,
                                        struct CUstream_st *s) {
  if (i < 0 || i >= FUSEDK_OP_COUNT)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "op_call: op %d, expected 0..%d", (int)i, FUSEDK_OP_COUNT - 1);
  if (!t || !a) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "op_call: %s: tensors or attrs is NULL", fusedk__op(i)->name);
  fusedk_status ast = fusedk__check_int_attrs(fusedk__op(i), a);
  if (ast || (ast = fusedk__check_out_dtype(fusedk__op(i), t, a))) return ast;
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
    case FUSEDK_OP_ROPE:
      return fusedk_rope(t[0], t[1], t[2], t[3], t[4], t[5], (fusedk_rope_style)(int)a[0], (int32_t)a[1], s);
    case FUSEDK_OP_ROPE_TABLE_1D: return fusedk_rope_table_1d(t[0], t[1], t[2], (int32_t)a[0], (float)a[1], s);
    case FUSEDK_OP_ROPE_TABLE_AXES: {
      int32_t dims[4], n = 0;
      while (n < 4 && a[1 + n] != 0.0) dims[n] = (int32_t)a[1 + n], ++n;
      return fusedk_rope_table_axes(t[0], t[1], t[2], dims, n, (float)a[0], s);
    }
    case FUSEDK_OP_ROPE_TABLE_LTX: return fusedk_rope_table_ltx(t[0], t[1], t[2], (int32_t)a[0], (float)a[1], s);
    case FUSEDK_OP_ROPE_TABLE_MIXED: return fusedk_rope_table_mixed(t[0], t[1], t[2], t[3], s);
    case FUSEDK_OP_QK_NORM_ROPE:
      return fusedk_qk_norm_rope(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], (float)a[0],
                                 (fusedk_qk_norm)(int)a[1], (fusedk_rope_style)(int)a[2], (fusedk_layout)(int)a[3],
                                 (int32_t)a[4], s);
    case FUSEDK_OP_QK_NORM_ROPE_INT8: {
      const fusedk_scaled_tensor q = {t[0], t[1]}, k = {t[2], t[3]};
      return fusedk_qk_norm_rope_int8(&q, &k, t[4], t[5], t[6], t[7], t[8], t[9], (float)a[0],
                                      (fusedk_qk_norm)(int)a[1], (fusedk_rope_style)(int)a[2], (int32_t)a[3], s);
    }
    case FUSEDK_OP_LINEAR: return fusedk_linear(t[0], t[1], t[2], t[3], t[4], (fusedk_activation)(int)a[0], (int32_t)a[1], s);
    case FUSEDK_OP_RMSNORM_FP8: {
      const fusedk_scaled_tensor y = {t[0], t[1]};
      return fusedk_rmsnorm_fp8(&y, t[2], t[3], t[4], t[5], (float)a[0], s);
    }
    case FUSEDK_OP_LAYERNORM_FP8: {
      const fusedk_scaled_tensor y = {t[0], t[1]};
      return fusedk_layernorm_fp8(&y, t[2], t[3], t[4], (float)a[0], s);
    }
    case FUSEDK_OP_ADALN_FP8: {
      const fusedk_scaled_tensor y = {t[0], t[1]};
      return fusedk_adaln_fp8(&y, t[2], t[3], t[4], (fusedk_norm)(int)a[0], t[5], t[6], (float)a[1], s);
    }
    case FUSEDK_OP_QUANTIZE_FP8: {
      const fusedk_scaled_tensor q = {t[0], t[1]};
      return fusedk_quantize_fp8(&q, t[2], s);
    }
    case FUSEDK_OP_DEQUANTIZE_FP8: {
      const fusedk_scaled_tensor x = {t[1], t[2]};
      return fusedk_dequantize_fp8(t[0], &x, s);
    }
    case FUSEDK_OP_GLU_FP8: {
      const fusedk_scaled_tensor q = {t[0], t[1]};
      return fusedk_glu_fp8(&q, t[2], (fusedk_activation)(int)a[0], (fusedk_glu_half)(int)a[1], s);
    }
    case FUSEDK_OP_LINEAR_FP8: {
      const fusedk_scaled_tensor x = {t[2], t[3]}, w = {t[4], t[5]};
      return fusedk_linear_fp8(t[0], t[1], &x, &w, t[6], (fusedk_activation)(int)a[0], (int32_t)a[3], s);
    }
    case FUSEDK_OP_QUANTIZE_INT8: {
      const fusedk_scaled_tensor q = {t[0], t[1]};
      return fusedk_quantize_int8(&q, t[2], s);
    }
    case FUSEDK_OP_LINEAR_W8: {
      const fusedk_scaled_tensor w = {t[3], t[4]};
      return fusedk_linear_w8(t[0], t[1], t[2], &w, t[5], (fusedk_activation)(int)a[0], s);
    }
    case FUSEDK_OP_CONV:
      return fusedk_conv(t[0], t[1], t[2], t[3], t[4], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)a[3],
                         (int32_t)a[4], (int32_t)a[5], (fusedk_activation)(int)a[6], (int32_t)a[7], s);
    case FUSEDK_OP_FOLD_BATCHNORM:
      return fusedk_fold_batchnorm(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], (float)a[0], s);
    case FUSEDK_OP_GROUP_NORM:
      return fusedk_group_norm(t[0], t[1], t[2], t[3], t[4], t[5], (int32_t)a[0], (float)a[1],
                               (fusedk_activation)(int)a[2], s);
    case FUSEDK_OP_CHANNEL_RMSNORM:
      return fusedk_channel_rmsnorm(t[0], t[1], t[2], t[3], t[4], t[5], (float)a[0], (int32_t)a[1],
                                    (fusedk_activation)(int)a[2], s);
    case FUSEDK_OP_ATTENTION:
      return fusedk_attention(t[0], t[1], t[2], t[3], t[4], t[5], (float)a[0], (int32_t)a[1], s);
    case FUSEDK_OP_ATTENTION_INT8_SCALED: {
      const fusedk_scaled_tensor q = {t[2], t[3]}, k = {t[4], t[5]};
      return fusedk_attention_int8_scaled(t[0], t[1], t[2] ? &q : NULL, t[4] ? &k : NULL, t[6], t[7], (float)a[0],
                                          (int32_t)a[1], s);
    }
    case FUSEDK_OP_ATTENTION_INT8:
      return fusedk_attention_int8(t[0], t[1], t[2], t[3], t[4], t[5], (float)a[0], (int32_t)a[1], s);
    case FUSEDK_OP_LOWRANK_UPDATE: return fusedk_lowrank_update(t[0], t[1], t[2], t[3], t[4], t[5], (float)a[0], (float)a[1], s);
    case FUSEDK_OP_LOWRANK_PREPARE: return fusedk_lowrank_prepare(t[0], t[1], t[2], (float)a[0], s);
    case FUSEDK_OP_LINEAR_LOWRANK:
      return fusedk_linear_lowrank(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], (fusedk_activation)(int)a[0], s);
    case FUSEDK_OP_LOWRANK_UPDATE_BACKWARD:
      return fusedk_lowrank_update_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], (float)a[0], s);
    case FUSEDK_OP_LINEAR_LOWRANK_BACKWARD:
      return fusedk_linear_lowrank_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11],
                                            (fusedk_activation)(int)a[0], (float)a[1], s);
    case FUSEDK_OP_LINEAR_BACKWARD:
      return fusedk_linear_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], (fusedk_activation)(int)a[0],
                                    (int32_t)a[1], s);
    case FUSEDK_OP_DIFFUSION_STEP: {
      fusedk_step p;
      p.guidance = (float)a[0], p.sampler = (int32_t)a[1], p.sigma = (float)a[2], p.sigma_next = (float)a[3];
      p.alpha_bar = (float)a[4], p.alpha_bar_prev = (float)a[5], p.clamp_x0 = (float)a[6], p.blend = (float)a[7];
      return fusedk_diffusion_step(t[0], t[1], t[2], t[3], t[4], &p, s);
    }
  }
  return FUSEDK_ERR_INVALID_ARGUMENT;
}

/* --- [validate] every argument against its op's registry entry, in one routine ----------------- */

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
  for (int k = 0; k < o->n_tensors; ++k) /* a row scale's dims are the rows' leading dims */
    rows[k] = o->tensors[k].role == FUSEDK_ROLE_ROW || o->tensors[k].role == FUSEDK_ROLE_ROW_HALF ||
                      o->tensors[k].role == FUSEDK_ROLE_ROW_SCALE ? t[k] : NULL;
  int m = fusedk__levels(t[ref], o->n_tensors, rows, size, st);
  if (m > 2) {
    char shp[160], who[128] = "";
    int one = -1; /* a tensor that cannot flatten on its own, else they cannot jointly: named together */
    for (int k = 0; k < o->n_tensors && one < 0; ++k)
      if (rows[k] && fusedk__levels(t[ref], 1, &rows[k], size, st) > 2) one = k;
    for (int k = 0; k < o->n_tensors; ++k)
      if (one < 0 ? rows[k] != NULL : k == one) {
        const size_t n = strlen(who);
        snprintf(who + n, sizeof who - n, "%s%s", n ? ", " : "", o->tensors[k].name);
      }
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: the leading dims of %s%s (shape %s) have strides that do not "
                        "flatten to at most two levels of rows; pass views with mergeable leading dims",
                        o->name, who, one < 0 ? " jointly" : "", fusedk__shape_str(t[ref], shp, sizeof shp));
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

/* An op's reference tensor: its first required input of the call's dtype (x; what shapes and
   dtypes follow), else (the table builders: every input float32) its first required input. */
static int fusedk__ref(const fusedk_op *o) {
  int ref = -1;
  for (int i = 0; i < o->n_tensors; ++i) {
    if (o->tensors[i].kind != FUSEDK_ARG_IN) continue;
    if (ref < 0) ref = i;
    if (o->tensors[i].scalar < 0) return i;
  }
  return ref < 0 ? o->n_tensors : ref;
}

/* Checks every argument of op `o` against its registry entry, in one place: presence, dtype and
   device (the reference's), alignment, contiguous last dim, shape by role, outputs that do not
   broadcast, optional outputs only with their input. Fills s. */
static fusedk_status fusedk__validate(const fusedk_op *o, const fusedk_tensor *const *t, fusedk__rowset *s) {
  memset(s, 0, sizeof *s);
  const int ref = fusedk__ref(o);
  const char *xn = o->tensors[ref].name;
  s->c.op = o->name, s->c.ref = xn, s->c.scalar = -1, s->c.out_scalar = -1;
  int present;
  fusedk_status st = fusedk__check_tensor(&s->c, t[ref], xn, 1, o->tensors[ref].scalar, &present);
  if (st) return st;
  const fusedk_tensor *x = t[ref];
  if (o->row_ndim > 0 && x->ndim != o->row_ndim)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has ndim %d, expected %d (%s)", o->name, xn, (int)x->ndim,
                        (int)o->row_ndim, o->row_ndim == 3 ? "[B, L, D]" : "[B, S, H, Dh]");
  s->D = x->shape[x->ndim - 1];
  if (o->row_ndim >= 0 && s->D < 1)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has last dim 0, expected >= 1", o->name, xn);
  const int64_t B = x->shape[0], bd[2] = {B, s->D};
  /* inputs before outputs: a bad input is named, not the output a binding allocated like it */
  for (int k = 0; k < 2 * o->n_tensors; ++k) {
    const int i = k % o->n_tensors;
    const fusedk_op_tensor *a = &o->tensors[i];
    if ((a->kind >= FUSEDK_ARG_OUT) != (k >= o->n_tensors)) continue;
    if (i != ref) {
      const int required = a->kind == FUSEDK_ARG_IN || a->kind == FUSEDK_ARG_OUT;
      if ((st = fusedk__check_tensor(&s->c, t[i], a->name, required, a->scalar, &present))) return st;
      if (!present) continue;
      if (a->kind == FUSEDK_ARG_OUT_OPT && a->when >= 0 && !t[a->when])
        return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is given but %s is NULL, expected both or neither",
                            o->name, a->name, o->tensors[a->when].name);
      /* an input's shape follows the reference, an output's its like input */
      const int like = a->kind >= FUSEDK_ARG_OUT ? a->like : ref;
      const fusedk_tensor *r = t[like];
      char why[64];
      if (a->role == FUSEDK_ROLE_ROW) {
        snprintf(why, sizeof why, "same as %s", o->tensors[like].name);
        st = fusedk__check_shape(&s->c, t[i], a->name, r->ndim, r->shape, why);
      } else if (a->role == FUSEDK_ROLE_ROW_HALF) {
        int64_t half[FUSEDK_MAX_DIMS];
        memcpy(half, r->shape, (size_t)r->ndim * sizeof *half);
        half[r->ndim - 1] = r->shape[r->ndim - 1] / 2;
        snprintf(why, sizeof why, "%s with half its last dim", o->tensors[like].name);
        st = r->shape[r->ndim - 1] % 2
                 ? fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has last dim %lld, expected an even size (two halves)",
                                o->name, o->tensors[like].name, (long long)r->shape[r->ndim - 1])
                 : fusedk__check_shape(&s->c, t[i], a->name, r->ndim, half, why);
      } else if (a->role == FUSEDK_ROLE_ROW_SCALE) {
        const int64_t one = 1;
        snprintf(why, sizeof why, "the leading dims of %s%s", o->tensors[like].name, r->ndim == 1 ? " ([1])" : "");
        st = fusedk__check_shape(&s->c, t[i], a->name, r->ndim > 1 ? r->ndim - 1 : 1, r->ndim > 1 ? r->shape : &one, why);
      } else if (a->role == FUSEDK_ROLE_COLUMN) {
        snprintf(why, sizeof why, "last dim of %s", xn);
        st = fusedk__check_shape(&s->c, t[i], a->name, 1, bd + 1, why);
      } else if (a->role == FUSEDK_ROLE_SAMPLE) {
        snprintf(why, sizeof why, "[B, D] of %s", xn);
        st = fusedk__check_shape(&s->c, t[i], a->name, 2, bd, why);
        s->r[i].sb = fusedk__stride(t[i], 0);
      } /* FUSEDK_ROLE_OWN: the op's entry point checks the shape */
      if (st || (a->kind >= FUSEDK_ARG_OUT && (st = fusedk__check_output(&s->c, t[i], a->name)))) return st;
    }
    s->r[i].p = fusedk__base(t[i]);
  }
  if (o->row_ndim == 0) return fusedk__flatten_rows(o, t, ref, s);
  if (o->row_ndim != 3) return FUSEDK_OK; /* the op walks the strides itself */
  s->B = B, s->L = x->shape[1]; /* [B, L, D]: B stays, the per-sample vectors index it */
  for (int i = 0; i < o->n_tensors; ++i) /* (a row scale [B, L]: its own two dims) */
    if (t[i] && (o->tensors[i].role == FUSEDK_ROLE_ROW || o->tensors[i].role == FUSEDK_ROLE_ROW_HALF ||
                 o->tensors[i].role == FUSEDK_ROLE_ROW_SCALE))
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

/* The 8-bit rows' quantization (int8: qmax 127, weights 127.5; e4m3: 448), in float32 as the GPU's: the row's
   largest magnitude (a NaN wins), and qmax / amax where that is finite and amax > 0, else 0 */
static float fusedk__amax(float m, float x) { return m != m || x != x ? NAN : fabsf(x) > m ? fabsf(x) : m; }
static float fusedk__q_inv(float amax, float qmax) {
  const float r = qmax / amax;
  return amax > 0.0f && r < HUGE_VALF ? r : 0.0f;
}

/* The int8 rows' quantization, in float32 as the GPU's: fusedk__amax, x * fusedk__q_inv(amax,
   qmax) rounded to nearest, ties to even, within [lo, 127] (attention_int8 and
   qk_norm_rope_int8: qmax 127, lo -127; quantize_int8's weights: qmax 127.5, lo -128, torchao's
   symmetric int8); where qmax / amax is not finite every value is 0; amax Inf or NaN: every
   value 0 and the scale non-finite, so the row dequantizes to NaN */
static double fusedk__i8(float x, float inv, float lo) {
  const float r = rintf(x * inv);
  return r != r ? 0.0 : r > 127.0f ? 127.0 : r < lo ? (double)lo : (double)r;
}

/* float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; subnormals step 2^-9, no Inf,
   0x7f/0xff NaN, 448 the largest. */
static double fusedk__e4m3_to_f64(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = (b & 0x7f) == 0x7f ? NAN : e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
  return b & 0x80 ? -v : v;
}

/* rounded to nearest, ties to even, saturating at +-448 (Inf too); NaN 0x7f (the GPU's
   cvt.rn.satfinite.e4m3x2.f32) */
static uint8_t fusedk__f32_to_e4m3(float f) {
  if (f != f) return 0x7f;
  const uint8_t sign = signbit(f) ? 0x80 : 0;
  const double r = fusedk__round_prec(fabs((double)f), 4, -6);
  if (r >= 448.0) return sign | 0x7e;
  if (r < ldexp(1.0, -6)) return (uint8_t)(sign | (uint8_t)(r * 512.0)); /* 2^-6 itself: 8 = exponent 1 */
  int e;
  const double f2 = frexp(r, &e); /* r = f2 2^e, f2 in [0.5, 1) */
  return (uint8_t)(sign | (e + 6) << 3 | ((int)(f2 * 16.0) - 8));
}

static double fusedk__load(const void *p, int64_t i, int s) {
  if (s == FUSEDK_F32) return ((const float *)p)[i];
  if (s == FUSEDK_E4M3) return fusedk__e4m3_to_f64(((const uint8_t *)p)[i]);
  if (s == FUSEDK_I8) return ((const int8_t *)p)[i];
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

/* A row of float32 values (given as doubles, rounded to float32 here) quantized with its scale as
   quantize_fp8 states it (fusedk.h's FP8 rules): the amax (a NaN wins), x * (448 / amax) in
   float32, rounded to e4m3; scale amax / 448. i8 (quantize_int8): scale amax / 127.5, int8 data
   x * (1 / scale) in [-128, 127]. */
static void fusedk__quantize_row(const double *v, int64_t D, uint8_t *q, float *scale, int i8) {
  const float qmax = i8 ? 127.5f : 448.0f;
  float amax = 0.0f;
  for (int64_t d = 0; d < D; ++d) amax = fusedk__amax(amax, (float)v[d]);
  *scale = amax / qmax;
  const float inv = i8 ? fusedk__q_inv(*scale, 1.0f) : fusedk__q_inv(amax, qmax); /* int8: 1 / scale, torchao's */
  for (int64_t d = 0; d < D; ++d)
    q[d] = i8 ? (uint8_t)(int8_t)fusedk__i8((float)v[d], inv, -128.0f) : fusedk__f32_to_e4m3((float)v[d] * inv);
}

static void *fusedk__at(const fusedk__rows *r, int64_t b, int64_t l, int s) {
  return (char *)((uintptr_t)r->p + (uintptr_t)((b * r->sb + l * r->sl) * (int64_t)fusedk__scalar_size(s)));
}

/* 0, or -1 when the row buffer cannot be allocated (nothing written then) */
static int fusedk__norm_cpu(const fusedk__norm_args *a) {
  const int s = a->scalar;
  const int64_t D = a->D;
  double *v = (double *)malloc((size_t)D * 2 * sizeof(double)), *out = v + D; /* out: a q8 row's results */
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
      void *y = fusedk__at(&a->y, b, l, a->q8 ? FUSEDK_E4M3 : s);
      void *ro = a->res_out.p ? fusedk__at(&a->res_out, b, l, s) : NULL;
      const void *base = a->base.p ? fusedk__at(&a->base, b, l, s) : NULL;
      const void *sc = a->scale.p ? fusedk__at(&a->scale, b, 0, a->mod) : NULL;
      const void *sh = a->shift.p ? fusedk__at(&a->shift, b, 0, a->mod) : NULL;
      const void *g = a->gate.p ? fusedk__at(&a->gate, b, 0, s) : NULL;
      for (int64_t d = 0; d < D; ++d) {
        double n = (v[d] - mean) * rstd;
        if (a->weight) n *= fusedk__load(a->weight, d, s);
        if (a->bias) n += fusedk__load(a->bias, d, s);
        if (sc) n *= 1.0 + fusedk__load(sc, d, a->mod);
        if (sh) n += fusedk__load(sh, d, a->mod);
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
        if (a->q8) out[d] = n;
        else fusedk__store(y, d, n, s);
      }
      if (a->q8) fusedk__quantize_row(out, D, (uint8_t *)y, (float *)fusedk__at(&a->ys, b, l, FUSEDK_F32), 0);
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
  a.op = op, a.scalar = a.mod = s->c.scalar, a.eps = eps;
  a.B = s->B, a.L = s->L, a.D = s->D;
  return a;
}

FUSEDK_DEF fusedk_status fusedk_rmsnorm(const fusedk_tensor *y, const fusedk_tensor *residual_out,
                                        const fusedk_tensor *x, const fusedk_tensor *residual,
                                        const fusedk_tensor *weight, float eps, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, residual_out, x, residual, weight};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_RMSNORM), t, &s);
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
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LAYERNORM), t, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  fusedk__norm_args a = fusedk__norm_of(&s, FUSEDK_OP_LAYERNORM, eps);
  a.y = s.r[0], a.x = s.r[1], a.weight = s.r[2].p, a.bias = s.r[3].p;
  return fusedk__norm_run(&s.c, &a, stream);
}

/* adaln's own checks (norm, bias, eps, the modulation's dtype); sets a's mod and rms */
static fusedk_status fusedk__adaln_checks(const fusedk__check *c, const fusedk_tensor *scale,
                                          const fusedk_tensor *shift, fusedk_norm norm, const fusedk_tensor *bias,
                                          float eps, fusedk__norm_args *a) {
  if (norm != FUSEDK_NORM_LAYER && norm != FUSEDK_NORM_RMS)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: norm is %d, expected FUSEDK_NORM_LAYER (0) or "
                        "FUSEDK_NORM_RMS (1)", c->op, (int)norm);
  if (bias && norm == FUSEDK_NORM_RMS)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: bias is given with FUSEDK_NORM_RMS, expected NULL "
                        "(RMSNorm has no bias)", c->op);
  fusedk_status st = fusedk__check_eps(c, eps);
  if (st) return st;
  const int ms = fusedk__scalar_of(scale->dtype);
  if (fusedk__scalar_of(shift->dtype) != ms)
    return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: shift has dtype %s, expected %s (the dtype of scale)", c->op,
                        fusedk__scalar_name(fusedk__scalar_of(shift->dtype)), fusedk__scalar_name(ms));
  a->mod = ms, a->rms = norm == FUSEDK_NORM_RMS;
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_adaln(const fusedk_tensor *y, const fusedk_tensor *x, const fusedk_tensor *scale,
                                      const fusedk_tensor *shift, fusedk_norm norm, const fusedk_tensor *weight,
                                      const fusedk_tensor *bias, float eps, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x, scale, shift, weight, bias};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_ADALN), t, &s);
  if (st) return st;
  fusedk__norm_args a = fusedk__norm_of(&s, FUSEDK_OP_ADALN, eps);
  if ((st = fusedk__adaln_checks(&s.c, scale, shift, norm, bias, eps, &a))) return st;
  a.y = s.r[0], a.x = s.r[1], a.scale = s.r[2], a.shift = s.r[3], a.weight = s.r[4].p, a.bias = s.r[5].p;
  return fusedk__norm_run(&s.c, &a, stream);
}

/* The _fp8 forms: the plain op's checks on the same tensors (y's data in y's place), then its
   run with y's scales */
static fusedk_status fusedk__norm_fp8(int32_t id, const fusedk_tensor *const *t, fusedk__norm_args *a,
                                      fusedk__rowset *s) {
  fusedk_status st = fusedk__validate(fusedk__op(id), t, s);
  if (st) return st;
  memset(a, 0, sizeof *a);
  a->scalar = a->mod = s->c.scalar, a->B = s->B, a->L = s->L, a->D = s->D, a->q8 = 1;
  a->y = s->r[0], a->ys = s->r[1];
  /* y's data and scale against every other tensor (and each other): an e4m3 y cannot alias a
     16-bit input exactly, so any overlap is a partial one the row passes would race on */
  const fusedk_op *o = fusedk__op(id);
  for (int i = 0; i < 2; ++i)
    for (int k = i + 1; k < o->n_tensors; ++k)
      if ((st = fusedk__check_disjoint(&s->c, t[i], o->tensors[i].name, t[k], o->tensors[k].name))) return st;
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_rmsnorm_fp8(const fusedk_scaled_tensor *y, const fusedk_tensor *residual_out,
                                            const fusedk_tensor *x, const fusedk_tensor *residual,
                                            const fusedk_tensor *weight, float eps, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y ? y->data : NULL, y ? y->scale : NULL, residual_out, x, residual, weight};
  fusedk__rowset s;
  fusedk__norm_args a;
  fusedk_status st = fusedk__norm_fp8(FUSEDK_OP_RMSNORM_FP8, t, &a, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  a.op = FUSEDK_OP_RMSNORM, a.eps = eps, a.rms = 1;
  a.res_out = s.r[2], a.x = s.r[3], a.res = s.r[4], a.weight = s.r[5].p;
  return fusedk__norm_run(&s.c, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_layernorm_fp8(const fusedk_scaled_tensor *y, const fusedk_tensor *x,
                                              const fusedk_tensor *weight, const fusedk_tensor *bias, float eps,
                                              struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y ? y->data : NULL, y ? y->scale : NULL, x, weight, bias};
  fusedk__rowset s;
  fusedk__norm_args a;
  fusedk_status st = fusedk__norm_fp8(FUSEDK_OP_LAYERNORM_FP8, t, &a, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  a.op = FUSEDK_OP_LAYERNORM, a.eps = eps;
  a.x = s.r[2], a.weight = s.r[3].p, a.bias = s.r[4].p;
  return fusedk__norm_run(&s.c, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_adaln_fp8(const fusedk_scaled_tensor *y, const fusedk_tensor *x,
                                          const fusedk_tensor *scale, const fusedk_tensor *shift, fusedk_norm norm,
                                          const fusedk_tensor *weight, const fusedk_tensor *bias, float eps,
                                          struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y ? y->data : NULL, y ? y->scale : NULL, x, scale, shift, weight, bias};
  fusedk__rowset s;
  fusedk__norm_args a;
  fusedk_status st = fusedk__norm_fp8(FUSEDK_OP_ADALN_FP8, t, &a, &s);
  if (st || (st = fusedk__adaln_checks(&s.c, scale, shift, norm, bias, eps, &a))) return st;
  a.op = FUSEDK_OP_ADALN, a.eps = eps;
  a.x = s.r[2], a.scale = s.r[3], a.shift = s.r[4], a.weight = s.r[5].p, a.bias = s.r[6].p;
  return fusedk__norm_run(&s.c, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_residual_tanh_gated_rmsnorm(const fusedk_tensor *y, const fusedk_tensor *x,
                                                            const fusedk_tensor *x_res, const fusedk_tensor *gate,
                                                            float eps, int exact, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x, x_res, gate};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM), t, &s);
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

/* diffusion_step on one element: x, cond, uncond, prev (the last two used when given) */
static double fusedk__step_f64(const fusedk__ew_args *a, double x, double cond, double uncond, double prev) {
  const double *c = a->c;
  const double m = a->in[2].p ? uncond + c[FUSEDK__C_GUIDANCE] * (cond - uncond) : cond;
  double r;
  if (a->kind == FUSEDK_SAMPLER_EULER) {
    r = x + c[FUSEDK__C_DT] * m;
  } else {
    double x0 = (x - c[FUSEDK__C_SQRT_1MA] * m) * c[FUSEDK__C_RSQRT_A];
    if (c[FUSEDK__C_CLAMP] > 0.0) x0 = x0 < -c[FUSEDK__C_CLAMP] ? -c[FUSEDK__C_CLAMP] : x0 > c[FUSEDK__C_CLAMP] ? c[FUSEDK__C_CLAMP] : x0;
    r = c[FUSEDK__C_SQRT_AP] * x0 + c[FUSEDK__C_SQRT_1MAP] * m;
  }
  return a->in[3].p ? c[FUSEDK__C_BLEND] * r + (1.0 - c[FUSEDK__C_BLEND]) * prev : r;
}

static void fusedk__elementwise_cpu(const fusedk__ew_args *a) {
  const int s = a->scalar;
  for (int64_t b = 0; b < a->B; ++b)
    for (int64_t l = 0; l < a->L; ++l) {
      const void *p[4] = {NULL, NULL, NULL, NULL};
      for (int k = 0; k < 4; ++k)
        if (a->in[k].p) p[k] = fusedk__at(&a->in[k], b, l, k == 2 ? a->mod : s);
      void *y = fusedk__at(&a->y, b, l, s);
      for (int64_t d = 0; d < a->D; ++d) {
        const double v = fusedk__load(p[0], d, s);
        double r;
        if (a->op == FUSEDK_OP_ACT) r = fusedk__act_f64(v, a->kind);
        else if (a->op == FUSEDK_OP_SILU_FMA) r = fusedk__act_f64(v + fusedk__load(p[1], d, s) * fusedk__load(p[2], d, s), FUSEDK_ACT_SILU);
        else if (a->op == FUSEDK_OP_GLU) r = fusedk__act_f64(v, a->kind) * fusedk__load(p[1], d, s);
        else if (a->op == FUSEDK_OP_GATED_RESIDUAL) r = v + fusedk__load(p[2], d, a->mod) * fusedk__load(p[1], d, s);
        else r = fusedk__step_f64(a, v, fusedk__load(p[1], d, s), p[2] ? fusedk__load(p[2], d, s) : 0.0,
                                  p[3] ? fusedk__load(p[3], d, s) : 0.0);
        fusedk__store(y, d, r, s);
      }
    }
}

/* Validates registry op `op`'s tensors t (output first) into the arguments of kernel variant
   kop: y = the output, in[k] = the k-th input. */
static fusedk_status fusedk__ew_args_of(int op, const fusedk_tensor *const *t, int kop, int kind, fusedk__ew_args *a,
                                        fusedk__rowset *s) {
  const fusedk_op *o = fusedk__op(op);
  fusedk_status st = fusedk__validate(o, t, s);
  if (st) return st;
  memset(a, 0, sizeof *a);
  a->op = kop, a->scalar = a->mod = s->c.scalar, a->kind = kind;
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

/* glu's and glu_fp8's act and act_half */
static fusedk_status fusedk__check_glu(const char *op, int act, int act_half) {
  fusedk_status st = fusedk__check_act(op, "act", act);
  if (st) return st;
  if (act_half != FUSEDK_GLU_FIRST && act_half != FUSEDK_GLU_SECOND)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: act_half is %d, expected FUSEDK_GLU_FIRST (0) or "
                        "FUSEDK_GLU_SECOND (1)", op, act_half);
  return FUSEDK_OK;
}

/* glu (x split in halves) and glu_pair (value, gate): y = act(a) * b as one FUSEDK_OP_GLU run. */
static fusedk_status fusedk__glu(int op, const fusedk_tensor *const *t, int act, int act_half,
                                 struct CUstream_st *stream) {
  const fusedk_op *o = fusedk__op(op);
  fusedk_status st = fusedk__check_glu(o->name, act, act_half);
  if (st) return st;
  fusedk__ew_args a;
  fusedk__rowset s;
  if ((st = fusedk__ew_args_of(op, t, FUSEDK_OP_GLU, act, &a, &s))) return st;
  if (op == FUSEDK_OP_GLU) { /* the halves of x: same rows, the second H elements further */
    a.D = s.D / 2;
    fusedk__rows h = a.in[0];
    h.p = (void *)((uintptr_t)h.p + (uintptr_t)(a.D * (int64_t)fusedk__scalar_size(s.c.scalar))); /* NULL if empty */
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
  fusedk__ew_args a;
  fusedk__rowset s;
  fusedk_status st = fusedk__ew_args_of(FUSEDK_OP_GATED_RESIDUAL, t, FUSEDK_OP_GATED_RESIDUAL, 0, &a, &s);
  if (st) return st;
  a.mod = fusedk__scalar_of(gate->dtype);
  return fusedk__ew_run(&a, &s, stream);
}

/* --- [sampler] diffusion_step: an elementwise op with coefficients from the step ------------ */

static fusedk_status fusedk__check_finite(const char *op, const char *name, double v, double lo, double hi,
                                          const char *want) {
  if (!(v >= lo && v <= hi))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is %g, expected %s", op, name, v, want);
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_diffusion_step(const fusedk_tensor *out, const fusedk_tensor *x,
                                               const fusedk_tensor *cond, const fusedk_tensor *uncond,
                                               const fusedk_tensor *prev, const fusedk_step *step,
                                               struct CUstream_st *stream) {
  const char *op = "diffusion_step";
  if (!step) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: step is NULL, expected a fusedk_step", op);
  const fusedk_step p = *step;
  const double big = 3.4e38;
  fusedk_status st = FUSEDK_OK;
  if (p.sampler != FUSEDK_SAMPLER_EULER && p.sampler != FUSEDK_SAMPLER_DDIM)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: sampler is %d, expected FUSEDK_SAMPLER_EULER (0) or "
                        "FUSEDK_SAMPLER_DDIM (1)", op, (int)p.sampler);
  if ((st = fusedk__check_finite(op, "guidance", p.guidance, -big, big, "a finite number"))) return st;
  if (!uncond && p.guidance != 1.0f)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: guidance is %g but uncond is NULL, expected the "
                        "unconditional prediction with guidance (or guidance 1)", op, (double)p.guidance);
  if ((st = fusedk__check_finite(op, "blend", p.blend, -big, big, "a finite number"))) return st;
  if (!prev && p.blend != 1.0f)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: blend is %g but prev is NULL, expected the previous "
                        "frame with blend (or blend 1)", op, (double)p.blend);
  if (p.sampler == FUSEDK_SAMPLER_EULER) {
    if ((st = fusedk__check_finite(op, "sigma", p.sigma, -big, big, "a finite number")) ||
        (st = fusedk__check_finite(op, "sigma_next", p.sigma_next, -big, big, "a finite number")))
      return st;
  } else if ((st = fusedk__check_finite(op, "alpha_bar", p.alpha_bar, 1e-30, 1.0, "a value in (0, 1]")) ||
             (st = fusedk__check_finite(op, "alpha_bar_prev", p.alpha_bar_prev, 0.0, 1.0, "a value in [0, 1]")) ||
             (st = fusedk__check_finite(op, "clamp_x0", p.clamp_x0, 0.0, HUGE_VAL, ">= 0 (0: no clamp)"))) {
    return st;
  }
  const fusedk_tensor *t[] = {out, x, cond, uncond, prev};
  fusedk__ew_args a;
  fusedk__rowset s;
  if ((st = fusedk__ew_args_of(FUSEDK_OP_DIFFUSION_STEP, t, FUSEDK_OP_DIFFUSION_STEP, p.sampler, &a, &s))) return st;
  a.c[FUSEDK__C_GUIDANCE] = p.guidance;
  a.c[FUSEDK__C_DT] = (double)p.sigma_next - (double)p.sigma;
  a.c[FUSEDK__C_SQRT_1MA] = sqrt(1.0 - (double)p.alpha_bar);
  a.c[FUSEDK__C_RSQRT_A] = 1.0 / sqrt((double)p.alpha_bar);
  a.c[FUSEDK__C_CLAMP] = p.clamp_x0;
  a.c[FUSEDK__C_SQRT_AP] = sqrt((double)p.alpha_bar_prev);
  a.c[FUSEDK__C_SQRT_1MAP] = sqrt(1.0 - (double)p.alpha_bar_prev);
  a.c[FUSEDK__C_BLEND] = p.blend;
  return fusedk__ew_run(&a, &s, stream);
}

/* --- [position] rope and its tables: CPU references and entry points ----------------------- */

/* rope and qk_norm_rope: per token and tensor, the rstd (one of the row, or of each head), then
   each head normalized and rotated (pass-through channels normalized) in double, one rounding;
   q8: q' and k' rounded to float32 and quantized a head. */
static double fusedk__sq(double v) { return v * v; }

/* A head's channels after the norm (r, weights w from wo) and the rotation (tables c, sn), each
   handed to visit(ctx, channel, value): a rotated pair's two values once both are computed (in
   place, both are read before either is written), then the pass-through channels when pass */
typedef void (*fusedk__rope_visit)(void *ctx, int64_t d, double v);
static void fusedk__rope_head(const fusedk__rope_args *a, const char *in, double r, const void *w, int64_t wo,
                              const float *c, const float *sn, int64_t R, int pass, fusedk__rope_visit visit,
                              void *ctx) {
  const int s = a->scalar, il = a->style == FUSEDK_ROPE_INTERLEAVED;
  const int64_t half = R / 2;
#define FUSEDK__N(e) (fusedk__load(in, e, s) * r * (w ? fusedk__load(w, wo + (e), s) : 1.0))
  for (int64_t i = 0; i < half; ++i) {
    const int64_t ia = il ? 2 * i : i, ib = il ? 2 * i + 1 : i + half;
    const double va = FUSEDK__N(ia), vb = FUSEDK__N(ib);
    visit(ctx, ia, va * c[i] - vb * sn[i]);
    visit(ctx, ib, vb * c[i] + va * sn[i]);
  }
  for (int64_t d = R; pass && d < a->Dh; ++d) visit(ctx, d, FUSEDK__N(d));
#undef FUSEDK__N
}

/* The visitors: a store in the dtype; q8's largest magnitude (as float32), then its int8 values */
typedef struct { void *out; int s; float amax, inv; } fusedk__rope_sink;
static void fusedk__rope_store(void *ctx, int64_t d, double v) {
  const fusedk__rope_sink *k = (const fusedk__rope_sink *)ctx;
  fusedk__store(k->out, d, v, k->s);
}
static void fusedk__rope_amax(void *ctx, int64_t d, double v) {
  fusedk__rope_sink *k = (fusedk__rope_sink *)ctx;
  (void)d, k->amax = fusedk__amax(k->amax, (float)v);
}
static void fusedk__rope_i8(void *ctx, int64_t d, double v) {
  const fusedk__rope_sink *k = (const fusedk__rope_sink *)ctx;
  ((int8_t *)k->out)[d] = (int8_t)fusedk__i8((float)v, k->inv, -127.0f);
}

static void fusedk__rope_cpu(const fusedk__rope_args *a) {
  const int s = a->scalar;
  const int64_t es = (int64_t)fusedk__scalar_size(s), Dh = a->Dh;
  for (int j = 0; j < 3 && a->t[j].in; ++j) {
    if (a->t[j].H == 0) continue; /* no heads: its data may be NULL, no address to form */
    const int norm = j < 2 ? a->norm : FUSEDK_QK_NORM_NONE, q8 = a->q8 && j < 2;
    const int64_t R = j < 2 ? a->R : 0, H = a->t[j].H;
    const void *w = a->t[j].w;
    for (int64_t b = 0; b < a->B; ++b)
      for (int64_t q = 0; q < a->S; ++q) {
        const char *row = (const char *)a->t[j].in + (b * a->t[j].sb + q * a->t[j].ss) * es;
        double full = 0.0; /* FULL: the sum of squares over every head of the token */
        for (int64_t h = 0; norm == FUSEDK_QK_NORM_FULL && h < H; ++h)
          for (int64_t d = 0; d < Dh; ++d) full += fusedk__sq(fusedk__load(row + h * a->t[j].sh * es, d, s));
        for (int64_t h = 0; h < H; ++h) {
          const char *in = row + h * a->t[j].sh * es;
          double r = 1.0, sum = 0.0;
          if (norm == FUSEDK_QK_NORM_HEAD) {
            for (int64_t d = 0; d < Dh; ++d) sum += fusedk__sq(fusedk__load(in, d, s));
            r = 1.0 / sqrt(sum / (double)Dh + (double)a->eps);
          } else if (norm == FUSEDK_QK_NORM_FULL) {
            r = 1.0 / sqrt(full / (double)(H * Dh) + (double)a->eps);
          }
          const int64_t wo = norm == FUSEDK_QK_NORM_FULL ? h * Dh : 0; /* FULL: the head's weights */
          const float *c = a->tab[0].p + b * a->tab[0].sb + q * a->tab[0].ss + h * a->tab[0].sh;
          const float *sn = a->tab[1].p + b * a->tab[1].sb + q * a->tab[1].ss + h * a->tab[1].sh;
          const int64_t oe = b * a->t[j].ob + q * a->t[j].os + h * a->t[j].oh; /* the output head, elements */
          fusedk__rope_sink k = {(char *)a->t[j].out + oe * (q8 ? 1 : es), s, 0.0f, 0.0f};
          if (!q8) { /* in place without a norm, the pass-through channels are already there */
            fusedk__rope_head(a, in, r, w, wo, c, sn, R, k.out != in || norm != FUSEDK_QK_NORM_NONE,
                              fusedk__rope_store, &k);
            continue;
          }
          fusedk__rope_head(a, in, r, w, wo, c, sn, R, 1, fusedk__rope_amax, &k);
          k.inv = fusedk__q_inv(k.amax, 127.0f);
          fusedk__rope_head(a, in, r, w, wo, c, sn, R, 1, fusedk__rope_i8, &k);
          a->t[j].sc[b * a->t[j].cb + q * a->t[j].cs + h * a->t[j].ch] = k.amax / 127.0f;
        }
      }
  }
}

/* The strides of table t as [B, S, H, R/2] (size-1 dims broadcast), checked against q's B, S
   and the heads of q and k. */
static fusedk_status fusedk__rope_table(const char *op, const fusedk_tensor *t, const char *name,
                                        const fusedk_tensor *q, const fusedk_tensor *k, int64_t half, int64_t *st3) {
  const int nd = t->ndim;
  char shp[160];
  if (nd < 2 || nd > 4 || t->shape[nd - 1] != half)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected [S, R/2], [S, H, R/2] or [B, S, H, R/2] "
                        "with R/2 = %lld (rotary_dim / 2)", op, name, fusedk__shape_str(t, shp, sizeof shp),
                        (long long)half);
  const int64_t want[3] = {q->shape[0], q->shape[1], q->shape[2]};
  for (int d = 0; d < 3; ++d) { /* b, s, h */
    /* the table's dim for it, or < 0: absent ([S, R/2]: S; [S, H, R/2]: S, H; [B, S, H, R/2]) */
    const int td = d == 0 ? (nd == 4 ? 0 : -1) : d == 1 ? (nd == 4 ? 1 : 0) : (nd == 2 ? -1 : nd - 2);
    const int64_t size = td >= 0 ? t->shape[td] : 1;
    st3[d] = size == 1 ? 0 : fusedk__stride(t, td);
    const int ok = d == 1 ? size == want[1] : size == 1 || (size == want[d] && (d != 2 || !k || k->shape[2] == size));
    if (!ok)
      return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected its %s", op, name,
                          fusedk__shape_str(t, shp, sizeof shp), d == 0 ? "B dim to be 1 or q's B"
                          : d == 1 ? "S dim to be q's S (the positions)"
                          : "H dim to be 1 or the heads of q and k (equal)");
  }
  return FUSEDK_OK;
}

/* rope's and qk_norm_rope's common part: style, rotary_dim, the shapes of k and v against q,
   the tables; fills a (out: the outputs, their strides read as [B, S, H, Dh], or [B, H, S, Dh]
   when bhsd). */
static fusedk_status fusedk__rope_setup(const fusedk__check *c, const fusedk_tensor *const *out,
                                        const fusedk_tensor *const *in, const fusedk_tensor *cos,
                                        const fusedk_tensor *sin, int style, int32_t rotary_dim, int bhsd,
                                        fusedk__rope_args *a) {
  const char *op = c->op;
  const fusedk_tensor *q = in[0], *k = in[1];
  char shp[160];
  if (style != FUSEDK_ROPE_INTERLEAVED && style != FUSEDK_ROPE_HALF)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: style is %d, expected FUSEDK_ROPE_INTERLEAVED (0) or "
                        "FUSEDK_ROPE_HALF (1)", op, style);
  const int64_t Dh = q->shape[3], R = rotary_dim ? rotary_dim : Dh;
  if (Dh > 8192)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: q has shape %s, expected a head dim (last) of at most 8192", op,
                        fusedk__shape_str(q, shp, sizeof shp));
  if (R < 2 || R > Dh || R % 2)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: rotary_dim is %d, expected an even size 2..%lld (the "
                        "head dim; 0 = all of it)", op, (int)rotary_dim, (long long)Dh);
  for (int j = 1; j < 3; ++j) {
    const fusedk_tensor *t = in[j];
    if (t && (t->ndim != 4 || t->shape[0] != q->shape[0] || t->shape[1] != q->shape[1] || t->shape[3] != Dh ||
              (j == 2 && t->shape[2] != k->shape[2])))
      return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected [B, S, Hk, Dh] with q's B, S and Dh "
                          "(%lld, %lld, %lld)%s", op, j == 1 ? "k" : "v", fusedk__shape_str(t, shp, sizeof shp),
                          (long long)q->shape[0], (long long)q->shape[1], (long long)Dh, j == 2 ? " and k's Hk" : "");
  }
  if (fusedk__check_shape(c, sin, "sin", cos->ndim, cos->shape, "same as cos")) return FUSEDK_ERR_SHAPE;
  memset(a, 0, sizeof *a);
  a->scalar = c->scalar, a->style = style, a->norm = FUSEDK_QK_NORM_NONE;
  a->B = q->shape[0], a->S = q->shape[1], a->Dh = Dh, a->R = R;
  for (int j = 0; j < 3; ++j) {
    const fusedk_tensor *i = in[j], *o = out[j];
    if (!i) continue;
    if (!o)
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is given but %s_out is NULL, expected both or "
                          "neither", op, j == 0 ? "q" : j == 1 ? "k" : "v", j == 0 ? "q" : j == 1 ? "k" : "v");
    a->t[j].in = fusedk__base(i), a->t[j].out = fusedk__base(o), a->t[j].H = i->shape[2];
    a->t[j].sb = fusedk__stride(i, 0), a->t[j].ss = fusedk__stride(i, 1), a->t[j].sh = fusedk__stride(i, 2);
    a->t[j].ob = fusedk__stride(o, 0), a->t[j].os = fusedk__stride(o, bhsd ? 2 : 1);
    a->t[j].oh = fusedk__stride(o, bhsd ? 1 : 2);
  }
  for (int j = 0; j < 2; ++j) {
    int64_t st3[3] = {0, 0, 0};
    fusedk_status st = fusedk__rope_table(op, j ? sin : cos, j ? "sin" : "cos", q, k, R / 2, st3);
    if (st) return st;
    a->tab[j].p = (const float *)fusedk__base(j ? sin : cos);
    a->tab[j].sb = st3[0], a->tab[j].ss = st3[1], a->tab[j].sh = st3[2];
  }
  return FUSEDK_OK;
}

static fusedk_status fusedk__rope_run(const fusedk__rope_args *a, const fusedk__check *c, struct CUstream_st *stream) {
  if (a->B * a->S * (a->t[0].H + a->t[1].H + a->t[2].H) == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(c->dev.device_type)) return fusedk__cuda_rope(a, c->op, c->dev.device_id, stream);
  fusedk__rope_cpu(a);
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_rope(const fusedk_tensor *q_out, const fusedk_tensor *k_out, const fusedk_tensor *q,
                                     const fusedk_tensor *k, const fusedk_tensor *cos, const fusedk_tensor *sin,
                                     fusedk_rope_style style, int32_t rotary_dim, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {q_out, k_out, q, k, cos, sin};
  const fusedk_tensor *out[3] = {q_out, k_out, NULL}, *in[3] = {q, k, NULL};
  fusedk__rowset s;
  fusedk__rope_args a;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_ROPE), t, &s);
  if (st || (st = fusedk__rope_setup(&s.c, out, in, cos, sin, (int)style, rotary_dim, 0, &a))) return st;
  return fusedk__rope_run(&a, &s.c, stream);
}

/* qk_norm_rope's and qk_norm_rope_int8's checks past the registry's, first: eps and norm */
static fusedk_status fusedk__qk_norm_check(const fusedk__check *c, float eps, int norm) {
  fusedk_status st = fusedk__check_eps(c, eps);
  if (st) return st;
  if (norm != FUSEDK_QK_NORM_HEAD && norm != FUSEDK_QK_NORM_FULL && norm != FUSEDK_QK_NORM_NONE)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: norm is %d, expected FUSEDK_QK_NORM_HEAD (0), "
                        "FUSEDK_QK_NORM_FULL (1) or FUSEDK_QK_NORM_NONE (2)", c->op, norm);
  return FUSEDK_OK;
}

/* The outputs' shapes (registry outputs 0..n-1, by the rule the bindings allocate by; why: what
   the rule says, why_odd the odd outputs' where it differs (the scales), else NULL), while their
   like inputs are [B, S, H, Dh] (else rope_setup names the input) */
static fusedk_status fusedk__qk_out_shapes(const fusedk__check *c, int32_t id, const fusedk_tensor *const *t, int n,
                                           const double *attrs, const char *why, const char *why_odd) {
  const fusedk_op *o = fusedk__op(id);
  for (int j = 0; j < n; ++j) {
    int64_t shape[FUSEDK_MAX_DIMS];
    fusedk_status st;
    if (!t[j]) continue;
    if (t[o->tensors[j].like]->ndim != 4) break;
    const int nd = fusedk__out_shape(id, j, t, attrs, shape);
    if (nd < 0) return (fusedk_status)-nd;
    if ((st = fusedk__check_shape(c, t[j], o->tensors[j].name, nd, shape, j % 2 && why_odd ? why_odd : why)))
      return st;
  }
  return FUSEDK_OK;
}

/* ... and past rope_setup: FULL's width, the weights (registry tensors wi, wi + 1), into a */
static fusedk_status fusedk__qk_weights(const fusedk__check *c, const fusedk_op *o, const fusedk_tensor *const *in,
                                        const fusedk_tensor *const *w, int wi, float eps, int norm,
                                        fusedk__rope_args *a) {
  for (int j = 0; j < 2; ++j) {
    const fusedk_tensor *x = in[j];
    const int64_t n = norm == FUSEDK_QK_NORM_FULL ? x->shape[2] * x->shape[3] : x->shape[3];
    char why[64];
    fusedk_status st;
    if (norm == FUSEDK_QK_NORM_FULL && n > 8192)
      return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: norm is FULL over %s's H*Dh = %lld channels, expected at most 8192",
                          c->op, j ? "k" : "q", (long long)n);
    if (!w[j]) continue;
    if (norm == FUSEDK_QK_NORM_NONE)
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is given but norm is NONE, expected no weights", c->op,
                          o->tensors[wi + j].name);
    snprintf(why, sizeof why, "%s of %s", norm == FUSEDK_QK_NORM_FULL ? "H*Dh" : "Dh", j ? "k" : "q");
    if ((st = fusedk__check_shape(c, w[j], o->tensors[wi + j].name, 1, &n, why))) return st; /* contiguous: validated */
    a->t[j].w = fusedk__base(w[j]);
  }
  a->norm = (int32_t)norm, a->eps = eps;
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_qk_norm_rope(const fusedk_tensor *q_out, const fusedk_tensor *k_out,
                                             const fusedk_tensor *v_out, const fusedk_tensor *q,
                                             const fusedk_tensor *k, const fusedk_tensor *v,
                                             const fusedk_tensor *cos, const fusedk_tensor *sin,
                                             const fusedk_tensor *q_weight, const fusedk_tensor *k_weight,
                                             float eps, fusedk_qk_norm norm, fusedk_rope_style style,
                                             fusedk_layout layout, int32_t rotary_dim, struct CUstream_st *stream) {
  const fusedk_op *o = fusedk__op(FUSEDK_OP_QK_NORM_ROPE);
  const fusedk_tensor *t[] = {q_out, k_out, v_out, q, k, v, cos, sin, q_weight, k_weight};
  const double attrs[5] = {eps, (double)norm, (double)style, (double)layout, (double)rotary_dim};
  const int bhsd = layout == FUSEDK_LAYOUT_BHSD;
  fusedk__rowset s;
  fusedk__rope_args a;
  fusedk_status st = fusedk__validate(o, t, &s);
  if (st || (st = fusedk__qk_norm_check(&s.c, eps, (int)norm)) ||
      (st = fusedk__qk_out_shapes(&s.c, FUSEDK_OP_QK_NORM_ROPE, t, 3, attrs,
                                  bhsd ? "[B, H, S, Dh] of its input" : "its input's", NULL)) ||
      (st = fusedk__rope_setup(&s.c, t, t + 3, cos, sin, (int)style, rotary_dim, bhsd, &a)) ||
      (st = fusedk__qk_weights(&s.c, o, t + 3, t + 8, 8, eps, (int)norm, &a)))
    return st;
  return fusedk__rope_run(&a, &s.c, stream);
}

FUSEDK_DEF fusedk_status fusedk_qk_norm_rope_int8(const fusedk_scaled_tensor *q_out, const fusedk_scaled_tensor *k_out,
                                                  const fusedk_tensor *q, const fusedk_tensor *k,
                                                  const fusedk_tensor *cos, const fusedk_tensor *sin,
                                                  const fusedk_tensor *q_weight, const fusedk_tensor *k_weight,
                                                  float eps, fusedk_qk_norm norm, fusedk_rope_style style,
                                                  int32_t rotary_dim, struct CUstream_st *stream) {
  const fusedk_op *o = fusedk__op(FUSEDK_OP_QK_NORM_ROPE_INT8);
  const fusedk_tensor *t[] = {q_out ? q_out->data : NULL, q_out ? q_out->scale : NULL, k_out ? k_out->data : NULL,
                              k_out ? k_out->scale : NULL, q, k, cos, sin, q_weight, k_weight};
  const fusedk_tensor *out[3] = {t[0], t[2], NULL}, *in[3] = {q, k, NULL};
  const double attrs[4] = {eps, (double)norm, (double)style, (double)rotary_dim};
  fusedk__rowset s;
  fusedk__rope_args a;
  fusedk_status st = fusedk__validate(o, t, &s);
  if (st || (st = fusedk__qk_norm_check(&s.c, eps, (int)norm)) ||
      (st = fusedk__qk_out_shapes(&s.c, FUSEDK_OP_QK_NORM_ROPE_INT8, t, 4, attrs, "its input's",
                                  "[B, S, H] of its input")) ||
      (st = fusedk__rope_setup(&s.c, out, in, cos, sin, (int)style, rotary_dim, 0, &a)) ||
      (st = fusedk__qk_weights(&s.c, o, in, t + 8, 8, eps, (int)norm, &a)))
    return st;
  a.q8 = 1;
  for (int j = 0; j < 2; ++j) { /* the scales, [B, S, H] */
    const fusedk_tensor *sc = t[2 * j + 1];
    a.t[j].sc = (float *)fusedk__base(sc);
    a.t[j].cb = fusedk__stride(sc, 0), a.t[j].cs = fusedk__stride(sc, 1), a.t[j].ch = fusedk__stride(sc, 2);
  }
  return fusedk__rope_run(&a, &s.c, stream);
}

/* A table builder's common part: validation, the output shape, the strides. The attributes
   (dims, theta) are filled in by the caller before. */
static fusedk_status fusedk__rope_table_run(int op, const fusedk_tensor *const *t, const double *attrs,
                                            fusedk__table_args *a, struct CUstream_st *stream) {
  const fusedk_op *o = fusedk__op(op);
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(o, t, &s);
  if (st || (st = fusedk__check_finite(o->name, "theta", a->theta, 1e-30, 3.4e38, "a finite value > 0"))) return st;
  const fusedk_tensor *in = t[2];
  const int n_in = op == FUSEDK_OP_ROPE_TABLE_1D ? 1 : op == FUSEDK_OP_ROPE_TABLE_AXES ? a->n_axes : 3;
  if ((op == FUSEDK_OP_ROPE_TABLE_1D && in->ndim != 1) || (op != FUSEDK_OP_ROPE_TABLE_1D && (in->ndim != 2 || in->shape[1] != n_in))) {
    char shp[160];
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected %s%d]", o->name, o->tensors[2].name,
                        fusedk__shape_str(in, shp, sizeof shp), op == FUSEDK_OP_ROPE_TABLE_1D ? "[S" : "[S, ",
                        op == FUSEDK_OP_ROPE_TABLE_1D ? 0 : n_in);
  }
  if (op == FUSEDK_OP_ROPE_TABLE_MIXED) {
    char shp[160];
    const fusedk_tensor *f = t[3];
    if (f->ndim != 3 || f->shape[0] != 3)
      return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: freqs has shape %s, expected [3, H, F]", o->name,
                          fusedk__shape_str(f, shp, sizeof shp));
    a->freqs = (const float *)fusedk__base(f);
    a->fa = fusedk__stride(f, 0), a->fh = fusedk__stride(f, 1);
  }
  int64_t shape[FUSEDK_MAX_DIMS];
  const int nd = fusedk__out_shape(op, 0, t, attrs, shape);
  if (nd < 0) return (fusedk_status)-nd;
  for (int j = 0; j < 2; ++j)
    if ((st = fusedk__check_shape(&s.c, t[j], o->tensors[j].name, nd, shape, "the table of the inputs"))) return st;
  a->op = op;
  a->S = shape[0], a->H = nd == 3 ? shape[1] : 1, a->F = shape[nd - 1];
  a->in = (const float *)fusedk__base(in);
  a->is = fusedk__stride(in, 0), a->ia = in->ndim == 2 ? fusedk__stride(in, 1) : 0;
  for (int j = 0; j < 2; ++j) {
    a->out[j] = (float *)fusedk__base(t[j]);
    a->os[j] = fusedk__stride(t[j], 0), a->oh[j] = nd == 3 ? fusedk__stride(t[j], 1) : 0;
  }
  if (a->S * a->H * a->F == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s.c.dev.device_type)) return fusedk__cuda_rope_table(a, o->name, s.c.dev.device_id, stream);
  for (int64_t i = 0; i < a->S; ++i)
    for (int64_t h = 0; h < a->H; ++h)
      for (int64_t f = 0; f < a->F; ++f) {
        const double ang = fusedk__table_angle(a, i, h, f);
        a->out[0][i * a->os[0] + h * a->oh[0] + f] = (float)cos(ang);
        a->out[1][i * a->os[1] + h * a->oh[1] + f] = (float)sin(ang);
      }
  return FUSEDK_OK;
}

/* The tables of one dim (1d, ltx): attributes (dim, theta). */
static fusedk_status fusedk__rope_table_of_dim(int op, const fusedk_tensor *const *t, int32_t dim, float theta,
                                               struct CUstream_st *stream) {
  const double attrs[] = {(double)dim, theta};
  fusedk__table_args a;
  memset(&a, 0, sizeof a);
  a.dims[0] = dim, a.n_axes = op == FUSEDK_OP_ROPE_TABLE_1D ? 1 : 3, a.theta = theta;
  fusedk_status st = fusedk__check_dim(fusedk__op(op)->name, "dim", dim);
  return st ? st : fusedk__rope_table_run(op, t, attrs, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_rope_table_1d(const fusedk_tensor *cos, const fusedk_tensor *sin,
                                              const fusedk_tensor *positions, int32_t dim, float theta,
                                              struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {cos, sin, positions};
  return fusedk__rope_table_of_dim(FUSEDK_OP_ROPE_TABLE_1D, t, dim, theta, stream);
}

FUSEDK_DEF fusedk_status fusedk_rope_table_axes(const fusedk_tensor *cos, const fusedk_tensor *sin,
                                                const fusedk_tensor *ids, const int32_t *axes_dim, int32_t n_axes,
                                                float theta, struct CUstream_st *stream) {
  const char *op = "rope_table_axes";
  if (n_axes < 1 || n_axes > 4 || !axes_dim)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: n_axes is %d, expected 1..4 with axes_dim", op, (int)n_axes);
  const fusedk_tensor *t[] = {cos, sin, ids};
  double attrs[5] = {theta, 0, 0, 0, 0}; /* the registry's form: axes_dim 0-terminated */
  fusedk__table_args a;
  memset(&a, 0, sizeof a);
  for (int k = 0; k < n_axes; ++k) a.dims[k] = axes_dim[k], attrs[1 + k] = axes_dim[k];
  /* here, not only in the output shape: a 0 would end the attributes' list early */
  fusedk_status st = fusedk__check_axes(op, attrs + 1, n_axes, NULL);
  if (st) return st;
  a.n_axes = n_axes, a.theta = theta;
  return fusedk__rope_table_run(FUSEDK_OP_ROPE_TABLE_AXES, t, attrs, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_rope_table_ltx(const fusedk_tensor *cos, const fusedk_tensor *sin,
                                               const fusedk_tensor *coords, int32_t dim, float theta,
                                               struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {cos, sin, coords};
  return fusedk__rope_table_of_dim(FUSEDK_OP_ROPE_TABLE_LTX, t, dim, theta, stream);
}

FUSEDK_DEF fusedk_status fusedk_rope_table_mixed(const fusedk_tensor *cos, const fusedk_tensor *sin,
                                                 const fusedk_tensor *pos, const fusedk_tensor *freqs,
                                                 struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {cos, sin, pos, freqs};
  fusedk__table_args a;
  memset(&a, 0, sizeof a);
  a.n_axes = 3, a.theta = 1.0;
  return fusedk__rope_table_run(FUSEDK_OP_ROPE_TABLE_MIXED, t, NULL, &a, stream);
}

/* --- [linear] CPU references and entry points --------------------------------------------- */

/* d act / dz in double (the derivative of fusedk__act_f64; NONE: 1) */
static double fusedk__act_grad_f64(double z, int kind) {
  switch (kind) {
    case FUSEDK_ACT_GELU: return 0.5 * (1.0 + erf(z * 0.70710678118654752)) + z * exp(-0.5 * z * z) * 0.39894228040143268;
    case FUSEDK_ACT_GELU_TANH: {
      const double c = 0.79788456080286536, t = tanh(c * (z + 0.044715 * z * z * z));
      return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * z * z);
    }
    case FUSEDK_ACT_SILU: {
      const double sg = 1.0 / (1.0 + exp(-z));
      return sg * (1.0 + z * (1.0 - sg));
    }
    case FUSEDK_ACT_RELU: return z > 0.0 ? 1.0 : 0.0;
    default: return 1.0;
  }
}

/* act(z) as the GPU computes it: GELU (erf) and SILU, two passes, see z rounded to the dtype */
static double fusedk__linear_act(double z, int act, int s) {
  if (act == FUSEDK_ACT_NONE) return z;
  if (act == FUSEDK_ACT_GELU || act == FUSEDK_ACT_SILU) z = fusedk__round(z, s);
  return fusedk__act_f64(z, act);
}

static void *fusedk__mat_row(const fusedk__mat *m, int64_t r, int s) { /* integer math: p is NULL when K = 0 */
  return (void *)((uintptr_t)m->p + (uintptr_t)(r * m->ld * (int64_t)fusedk__scalar_size(s)));
}

/* rows r of matrix m as doubles (n columns each) */
static void fusedk__mat_rows(const fusedk__mat *m, int64_t rows, int64_t n, int s, double *out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) out[r * n + c] = fusedk__load(fusedk__mat_row(m, r, s), c, s);
}


/* The references: inputs converted to double once, dot products accumulated in double over
   contiguous rows, one rounding (dz rounded to the dtype before the backward GEMMs, as the GPU
   keeps it). 0, or -1 when a buffer cannot be allocated (nothing written then). */
static int fusedk__linear_cpu(const fusedk__linear_args *a) {
  const int s = a->scalar, is = a->op == FUSEDK_OP_LINEAR_FP8 ? FUSEDK_E4M3 : s; /* x's dtype */
  const int ws = a->op == FUSEDK_OP_LINEAR_W8 ? FUSEDK_I8 : is;                     /* w's */
  const int64_t M = a->M, N = a->N, K = a->K;
  double *w = (double *)malloc((size_t)(N * K + K + N) * sizeof(double) + 1), *xr = w + N * K, *b = xr + K;
  if (!w) return -1;
  fusedk__mat_rows(&a->w, N, K, ws, w);
  for (int64_t n = 0; n < N; ++n) b[n] = a->bias ? fusedk__load(a->bias, n, s) : 0.0;
  for (int64_t m = 0; m < M; ++m) {
    fusedk__mat row = {fusedk__mat_row(&a->x, m, is), 0};
    fusedk__mat_rows(&row, 1, K, is, xr);
    for (int64_t n = 0; n < N; ++n) {
      double z = a->ws ? 0.0 : b[n];
      for (int64_t k = 0; k < K; ++k) z += xr[k] * w[n * K + k];
      if (a->ws && K > 0) z = b[n] + z * (a->xs ? (double)a->xs[m] : 1.0) * (double)a->ws[n]; /* the scales after the sum */
      else if (a->ws) z = b[n]; /* K = 0: the bias alone, as the GPU (no scale read) */
      if (a->aux.p) fusedk__store(fusedk__mat_row(&a->aux, m, s), n, z, s);
      fusedk__store(fusedk__mat_row(&a->y, m, s), n, fusedk__linear_act(z, a->act, s), s);
    }
  }
  free(w);
  return 0;
}

static int fusedk__linear_backward_cpu(const fusedk__linear_args *a) {
  const int s = a->scalar;
  const int64_t M = a->M, N = a->N, K = a->K;
  double *dz = (double *)malloc((size_t)(M * N + M * K + N * K) * sizeof(double) + 1), *x = dz + M * N, *w = x + M * K;
  if (!dz) return -1;
  fusedk__mat_rows(&a->dy, M, N, s, dz);
  fusedk__mat_rows(&a->x, M, K, s, x);
  fusedk__mat_rows(&a->w, N, K, s, w);
  if (a->act != FUSEDK_ACT_NONE)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const double z = fusedk__load(fusedk__mat_row(&a->aux, m, s), n, s);
        dz[m * N + n] = fusedk__round(dz[m * N + n] * fusedk__act_grad_f64(z, a->act), s);
      }
  for (int64_t m = 0; a->dx.p && m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      double acc = 0.0;
      for (int64_t n = 0; n < N; ++n) acc += dz[m * N + n] * w[n * K + k];
      fusedk__store(fusedk__mat_row(&a->dx, m, s), k, acc, s);
    }
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; a->dw.p && k < K; ++k) {
      double acc = 0.0;
      for (int64_t m = 0; m < M; ++m) acc += dz[m * N + n] * x[m * K + k];
      fusedk__store(fusedk__mat_row(&a->dw, n, s), k, acc, s);
    }
    if (a->db) {
      double acc = 0.0;
      for (int64_t m = 0; m < M; ++m) acc += dz[m * N + n];
      fusedk__store(a->db, n, acc, s);
    }
  }
  free(dz);
  return 0;
}

/* A [..., n] matrix argument whose leading dims are `lead` (the M rows): its shape, and the one
   row stride its leading dims flatten to. */
static fusedk_status fusedk__linear_rows(const fusedk__check *c, const fusedk_tensor *t, const char *name,
                                         const fusedk_tensor *lead, const char *lead_name, int64_t n,
                                         fusedk__mat *m) {
  int64_t shape[FUSEDK_MAX_DIMS], size[FUSEDK_MAX_DIMS], st[1][FUSEDK_MAX_DIMS];
  char why[80];
  memcpy(shape, lead->shape, (size_t)lead->ndim * sizeof *shape);
  shape[lead->ndim - 1] = n;
  snprintf(why, sizeof why, "the leading dims of %s, then %lld", lead_name, (long long)n);
  fusedk_status e = fusedk__check_shape(c, t, name, lead->ndim, shape, why);
  if (e) return e;
  int64_t rows = 1;
  for (int i = 0; i < t->ndim - 1; ++i) rows *= t->shape[i];
  if (rows == 0 || n == 0) { /* no elements: no layout (NumPy gives empty arrays strides of 0) */
    m->p = fusedk__base(t), m->ld = n ? n : 1;
    return FUSEDK_OK;
  }
  const int levels = fusedk__levels(t, 1, &t, size, st);
  if (levels > 1) {
    char shp[160];
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: the leading dims of %s (shape %s) do not flatten to one row "
                        "stride, expected a view whose rows are evenly spaced (e.g. contiguous)", c->op, name,
                        fusedk__shape_str(t, shp, sizeof shp));
  }
  m->p = fusedk__base(t);
  m->ld = levels == 1 ? st[0][0] : n; /* one row: any stride, as a compact one */
  if (m->ld < n && levels == 1)
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has a row stride of %lld elements, expected >= %lld (its row "
                        "length: rows may not overlap)", c->op, name, (long long)m->ld, (long long)n);
  return FUSEDK_OK;
}

/* An [N, K] matrix (w, dw; shape checked) as pointer and row stride, rows not overlapping. */
static fusedk_status fusedk__linear_2d(const fusedk__check *c, const fusedk_tensor *t, const char *name,
                                       fusedk__mat *m) {
  const int64_t K = t->shape[1];
  m->p = fusedk__base(t);
  m->ld = t->shape[0] > 1 ? fusedk__stride(t, 0) : K;
  if (m->ld < K)
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has a row stride of %lld elements, expected >= %lld (K)", c->op,
                        name, (long long)m->ld, (long long)K);
  return FUSEDK_OK;
}

/* linear's, linear_backward's and linear_lowrank's common checks: act, tf32, w [N, K + extra]
   against x [..., K] (extra: linear_lowrank's h columns, w named w_cat there); a->K = K + extra. */
static fusedk_status fusedk__linear_common(const fusedk__check *c, int act, int32_t tf32, const fusedk_tensor *x,
                                           const fusedk_tensor *w, int64_t extra, fusedk__linear_args *a) {
  char shp[160];
  if (act < FUSEDK_ACT_GELU || act > FUSEDK_ACT_NONE)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: act is %d, expected FUSEDK_ACT_NONE (4), RELU (3), "
                        "GELU_TANH (1), GELU (0) or SILU (2)", c->op, act);
  if (tf32 != 0 && tf32 != 1)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: tf32 is %d, expected 0 or 1", c->op, (int)tf32);
  const int64_t K = x->shape[x->ndim - 1] + extra;
  if (w->ndim != 2 || w->shape[1] != K)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected [N, %lld] (%s)", c->op, extra ? "w_cat" : "w",
                        fusedk__shape_str(w, shp, sizeof shp), (long long)K,
                        extra ? "K = the last dim of x, plus A times a's rank rounded up to 8: lowrank_prepare's output"
                              : "K = the last dim of x");
  memset(a, 0, sizeof *a);
  a->scalar = c->scalar, a->act = act, a->tf32 = tf32;
  a->N = w->shape[0], a->K = K;
  a->M = 1;
  for (int i = 0; i < x->ndim - 1; ++i) a->M *= x->shape[i];
  return fusedk__linear_2d(c, w, extra ? "w_cat" : "w", &a->w);
}

static fusedk_status fusedk__linear_run(const fusedk__linear_args *a, const fusedk__check *c,
                                        struct CUstream_st *stream) {
  if (fusedk__is_gpu(c->dev.device_type)) return fusedk__cuda_linear(a, c->op, c->dev.device_id, stream);
  const int r = a->op != FUSEDK_OP_LINEAR_BACKWARD ? fusedk__linear_cpu(a) : fusedk__linear_backward_cpu(a);
  return r ? fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate the reference's buffers", c->op) : FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_linear(const fusedk_tensor *y, const fusedk_tensor *aux_out, const fusedk_tensor *x,
                                       const fusedk_tensor *w, const fusedk_tensor *bias, fusedk_activation act,
                                       int32_t tf32, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, aux_out, x, w, bias};
  fusedk__rowset s;
  fusedk__linear_args a;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LINEAR), t, &s);
  if (st || (st = fusedk__linear_common(&s.c, (int)act, tf32, x, w, 0, &a))) return st;
  a.op = FUSEDK_OP_LINEAR;
  if (bias && (st = fusedk__check_shape(&s.c, bias, "bias", 1, &a.N, "[N] (the first dim of w)"))) return st;
  if ((st = fusedk__linear_rows(&s.c, x, "x", x, "x", a.K, &a.x)) ||
      (st = fusedk__linear_rows(&s.c, y, "y", x, "x", a.N, &a.y)) ||
      (aux_out && (st = fusedk__linear_rows(&s.c, aux_out, "aux_out", x, "x", a.N, &a.aux))))
    return st;
  const fusedk_tensor *ins[] = {x, w, bias, aux_out};
  const char *names[] = {"x", "w", "bias", "aux_out"};
  for (int i = 0; i < 4; ++i)
    if ((st = fusedk__check_disjoint(&s.c, y, "y", ins[i], names[i])) ||
        (i < 3 && (st = fusedk__check_disjoint(&s.c, aux_out, "aux_out", ins[i], names[i]))))
      return st;
  a.bias = fusedk__base(bias);
  if (a.M == 0 || a.N == 0) return FUSEDK_OK;
  return fusedk__linear_run(&a, &s.c, stream);
}

FUSEDK_DEF fusedk_status fusedk_linear_backward(const fusedk_tensor *dx, const fusedk_tensor *dw,
                                                const fusedk_tensor *db, const fusedk_tensor *dy,
                                                const fusedk_tensor *x, const fusedk_tensor *w,
                                                const fusedk_tensor *aux, fusedk_activation act, int32_t tf32,
                                                struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {dx, dw, db, dy, x, w, aux};
  fusedk__rowset s;
  fusedk__linear_args a;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LINEAR_BACKWARD), t, &s);
  if (st || (st = fusedk__linear_common(&s.c, (int)act, tf32, x, w, 0, &a))) return st;
  a.op = FUSEDK_OP_LINEAR_BACKWARD;
  if (act != FUSEDK_ACT_NONE && !aux)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "linear_backward: aux is NULL, expected the forward's aux_out "
                        "(its pre-activation; for RELU its y will do) since act is not NONE");
  if ((st = fusedk__linear_rows(&s.c, x, "x", x, "x", a.K, &a.x)) ||
      (st = fusedk__linear_rows(&s.c, dy, "dy", x, "x", a.N, &a.dy)) ||
      (aux && (st = fusedk__linear_rows(&s.c, aux, "aux", x, "x", a.N, &a.aux))) ||
      (dx && (st = fusedk__linear_rows(&s.c, dx, "dx", x, "x", a.K, &a.dx))) ||
      (db && (st = fusedk__check_shape(&s.c, db, "db", 1, &a.N, "[N] (the first dim of w)"))) ||
      (dw && (st = fusedk__linear_2d(&s.c, dw, "dw", &a.dw)))) /* dw's shape: w's (validated) */
    return st;
  const fusedk_tensor *outs[] = {dx, dw, db}, *ins[] = {dy, x, w, aux};
  const char *onames[] = {"dx", "dw", "db"}, *inames[] = {"dy", "x", "w", "aux"};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j)
      if ((st = fusedk__check_disjoint(&s.c, outs[i], onames[i], ins[j], inames[j]))) return st;
    for (int j = i + 1; j < 3; ++j)
      if ((st = fusedk__check_disjoint(&s.c, outs[i], onames[i], outs[j], onames[j]))) return st;
  }
  a.db = fusedk__base(db);
  if (!dx && !dw && !db) return FUSEDK_OK;
  return fusedk__linear_run(&a, &s.c, stream);
}

/* quantize_fp8, dequantize_fp8 and quantize_int8: a row at a time, in float32 as the GPU computes it */
static int fusedk__quant_cpu(const fusedk__quant_args *a) {
  const int s = a->scalar;
  double *v = (double *)malloc((size_t)(a->D ? a->D : 1) * sizeof(double));
  if (!v) return -1;
  for (int64_t b = 0; b < a->B; ++b)
    for (int64_t l = 0; l < a->L; ++l) {
      void *x = fusedk__at(&a->x, b, l, s);
      uint8_t *q = (uint8_t *)fusedk__at(&a->q, b, l, FUSEDK_E4M3);
      float *sc = (float *)fusedk__at(&a->qs, b, l, FUSEDK_F32);
      if (a->dequant) {
        for (int64_t d = 0; d < a->D; ++d) fusedk__store(x, d, (double)((float)fusedk__e4m3_to_f64(q[d]) * *sc), s);
        continue;
      }
      const void *x2 = a->act >= 0 ? fusedk__at(&a->x2, b, l, s) : NULL;
      for (int64_t d = 0; d < a->D; ++d) /* glu_fp8: glu's values (in double) */
        v[d] = x2 ? fusedk__act_f64(fusedk__load(x, d, s), a->act) * fusedk__load(x2, d, s) : fusedk__load(x, d, s);
      fusedk__quantize_row(v, a->D, q, sc, a->i8);
    }
  free(v);
  return 0;
}

/* quantize_fp8, dequantize_fp8, glu_fp8 and quantize_int8's one entry: t = {x (or y), data,
   scale} in the op's order; act and act_half: glu_fp8's (x split in halves, act on the act_half one) */
static fusedk_status fusedk__quant_run(int32_t id, const fusedk_tensor *const *t, int act, int act_half,
                                       struct CUstream_st *stream) {
  const int dequant = id == FUSEDK_OP_DEQUANTIZE_FP8, glu = id == FUSEDK_OP_GLU_FP8;
  fusedk__rowset s;
  fusedk_status st = glu ? fusedk__check_glu(fusedk__op(id)->name, act, act_half) : FUSEDK_OK;
  if (st || (st = fusedk__validate(fusedk__op(id), t, &s))) return st;
  const int ix = dequant ? 0 : 2, iq = dequant ? 1 : 0, is = dequant ? 2 : 1;
  if (!dequant && ((st = fusedk__check_disjoint(&s.c, t[0], "out", t[2], "x")) ||
                   (st = fusedk__check_disjoint(&s.c, t[1], "out_scale", t[2], "x")) ||
                   (st = fusedk__check_disjoint(&s.c, t[1], "out_scale", t[0], "out"))))
    return st;
  if (dequant && ((st = fusedk__check_disjoint(&s.c, t[0], "y", t[1], "x")) ||
                  (st = fusedk__check_disjoint(&s.c, t[0], "y", t[2], "x_scale"))))
    return st;
  fusedk__quant_args a;
  memset(&a, 0, sizeof a);
  a.scalar = fusedk__scalar_of(t[ix]->dtype), a.dequant = dequant, a.act = glu ? act : -1;
  a.i8 = id == FUSEDK_OP_QUANTIZE_INT8;
  a.B = s.B, a.L = s.L, a.D = s.D, a.x = s.r[ix], a.q = s.r[iq], a.qs = s.r[is];
  if (glu) { /* the halves of x: x2 H elements further; x the act half */
    a.D = s.D / 2, a.x2 = a.x;
    a.x2.p = (void *)((uintptr_t)a.x.p + (uintptr_t)(a.D * (int64_t)fusedk__scalar_size(a.scalar)));
    if (act_half == FUSEDK_GLU_SECOND) {
      const fusedk__rows h = a.x;
      a.x = a.x2, a.x2 = h;
    }
  }
  if (a.B * a.L == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s.c.dev.device_type)) return fusedk__cuda_quant(&a, s.c.op, s.c.dev.device_id, stream);
  return fusedk__quant_cpu(&a) ? fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate a row of %lld doubles",
                                              s.c.op, (long long)a.D)
                               : FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_quantize_fp8(const fusedk_scaled_tensor *out, const fusedk_tensor *x,
                                             struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {out ? out->data : NULL, out ? out->scale : NULL, x};
  return fusedk__quant_run(FUSEDK_OP_QUANTIZE_FP8, t, -1, 0, stream);
}

FUSEDK_DEF fusedk_status fusedk_quantize_int8(const fusedk_scaled_tensor *out, const fusedk_tensor *x,
                                              struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {out ? out->data : NULL, out ? out->scale : NULL, x};
  return fusedk__quant_run(FUSEDK_OP_QUANTIZE_INT8, t, -1, 0, stream);
}

FUSEDK_DEF fusedk_status fusedk_dequantize_fp8(const fusedk_tensor *y, const fusedk_scaled_tensor *x,
                                               struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x ? x->data : NULL, x ? x->scale : NULL};
  return fusedk__quant_run(FUSEDK_OP_DEQUANTIZE_FP8, t, -1, 0, stream);
}

FUSEDK_DEF fusedk_status fusedk_glu_fp8(const fusedk_scaled_tensor *out, const fusedk_tensor *x, fusedk_activation act,
                                        fusedk_glu_half act_half, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {out ? out->data : NULL, out ? out->scale : NULL, x};
  return fusedk__quant_run(FUSEDK_OP_GLU_FP8, t, (int)act, (int)act_half, stream);
}

/* A float32 vector of n scales, contiguous (cuBLASLt reads it as one) */
static fusedk_status fusedk__scale_vec(const fusedk__check *c, const fusedk_tensor *t, const char *name, int64_t n) {
  int64_t e = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] > 1 && fusedk__stride(t, i) != e)
      return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s is not contiguous, expected its %lld scales side by side",
                          c->op, name, (long long)n);
    e *= t->shape[i];
  }
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_linear_fp8(const fusedk_tensor *y, const fusedk_tensor *aux_out,
                                           const fusedk_scaled_tensor *x, const fusedk_scaled_tensor *w,
                                           const fusedk_tensor *bias, fusedk_activation act, int32_t fast_accum,
                                           struct CUstream_st *stream) {
  const fusedk_tensor *xd = x ? x->data : NULL, *wd = w ? w->data : NULL;
  const fusedk_tensor *t[] = {y, aux_out, xd, x ? x->scale : NULL, wd, w ? w->scale : NULL, bias};
  fusedk__rowset s;
  fusedk__linear_args a;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LINEAR_FP8), t, &s);
  if (st || (st = fusedk__linear_common(&s.c, (int)act, 0, xd, wd, 0, &a))) return st;
  if (s.c.out_scalar != FUSEDK_F16 && s.c.out_scalar != FUSEDK_BF16)
    return fusedk__fail(FUSEDK_ERR_DTYPE, "linear_fp8: %s has dtype %s, expected float16 or bfloat16", s.c.out_ref,
                        fusedk__scalar_name(s.c.out_scalar));
  if (fast_accum != 0 && fast_accum != 1)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "linear_fp8: fast_accum is %d, expected 0 or 1", (int)fast_accum);
  a.op = FUSEDK_OP_LINEAR_FP8, a.scalar = s.c.out_scalar, a.fast_accum = fast_accum;
  if ((st = fusedk__check_shape(&s.c, t[5], "w_scale", 1, &a.N, "[N] (the first dim of w)")) ||
      (bias && (st = fusedk__check_shape(&s.c, bias, "bias", 1, &a.N, "[N] (the first dim of w)"))) ||
      (st = fusedk__scale_vec(&s.c, t[3], "x_scale", a.M)) || (st = fusedk__scale_vec(&s.c, t[5], "w_scale", a.N)) ||
      (st = fusedk__linear_rows(&s.c, xd, "x", xd, "x", a.K, &a.x)) ||
      (st = fusedk__linear_rows(&s.c, y, "y", xd, "x", a.N, &a.y)) ||
      (aux_out && (st = fusedk__linear_rows(&s.c, aux_out, "aux_out", xd, "x", a.N, &a.aux))))
    return st;
  const char *names[] = {"y", "aux_out", "x", "x_scale", "w", "w_scale", "bias"};
  for (int i = 1; i < 7; ++i)
    if ((st = fusedk__check_disjoint(&s.c, y, "y", t[i], names[i])) ||
        (i > 1 && (st = fusedk__check_disjoint(&s.c, aux_out, "aux_out", t[i], names[i]))))
      return st;
  a.bias = fusedk__base(bias), a.xs = (const float *)fusedk__base(t[3]), a.ws = (const float *)fusedk__base(t[5]);
  if (a.M == 0 || a.N == 0) return FUSEDK_OK;
  return fusedk__linear_run(&a, &s.c, stream);
}

FUSEDK_DEF fusedk_status fusedk_linear_w8(const fusedk_tensor *y, const fusedk_tensor *aux_out, const fusedk_tensor *x,
                                          const fusedk_scaled_tensor *w, const fusedk_tensor *bias,
                                          fusedk_activation act, struct CUstream_st *stream) {
  const fusedk_tensor *wd = w ? w->data : NULL, *t[] = {y, aux_out, x, wd, w ? w->scale : NULL, bias};
  fusedk__rowset s;
  fusedk__linear_args a;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LINEAR_W8), t, &s);
  if (st || (st = fusedk__linear_common(&s.c, (int)act, 0, x, wd, 0, &a))) return st;
  a.op = FUSEDK_OP_LINEAR_W8;
  if ((st = fusedk__check_shape(&s.c, t[4], "w_scale", 1, &a.N, "[N] (the first dim of w)")) ||
      (bias && (st = fusedk__check_shape(&s.c, bias, "bias", 1, &a.N, "[N] (the first dim of w)"))) ||
      (st = fusedk__scale_vec(&s.c, t[4], "w_scale", a.N)) ||
      (st = fusedk__linear_rows(&s.c, x, "x", x, "x", a.K, &a.x)) ||
      (st = fusedk__linear_rows(&s.c, y, "y", x, "x", a.N, &a.y)) ||
      (aux_out && (st = fusedk__linear_rows(&s.c, aux_out, "aux_out", x, "x", a.N, &a.aux))))
    return st;
  const char *names[] = {"y", "aux_out", "x", "w", "w_scale", "bias"};
  for (int i = 1; i < 6; ++i)
    if ((st = fusedk__check_disjoint(&s.c, y, "y", t[i], names[i])) ||
        (i > 1 && (st = fusedk__check_disjoint(&s.c, aux_out, "aux_out", t[i], names[i]))))
      return st;
  a.bias = fusedk__base(bias), a.ws = (const float *)fusedk__base(t[4]);
  if (a.M == 0 || a.N == 0) return FUSEDK_OK;
  return fusedk__linear_run(&a, &s.c, stream);
}

/* --- [attention] CPU reference and entry point ---------------------------------------------- */

/* How many keys row i of batch b sees: those before kv_len[b] (clamped to [0, Sk]) and, causal,
   those up to i + Sk - Sq */
static int64_t fusedk__attn_keys(const fusedk__attn_args *a, int64_t b, int64_t i) {
  int64_t n = a->Sk;
  if (a->kv_len) {
    const int64_t kv = a->kv_len[b * a->kv_stride];
    n = kv < 0 ? 0 : kv < n ? kv : n;
  }
  if (a->causal && i + a->Sk - a->Sq + 1 < n) n = i + a->Sk - a->Sq + 1 < 0 ? 0 : i + a->Sk - a->Sq + 1;
  return n;
}

/* Per (b, h, i): the row's scores in double, their max, the sum of their exps and the weighted
   sum of v, then one rounding. NaN scores propagate (the max skips them; their exps do not).
   x8 (attention_int8): q's and k's dequantized values, compact [B, S, H, Dh] each, read instead. */
static int fusedk__attention_core(const fusedk__attn_args *a, const double *const *x8) {
  const int64_t G = a->Hq / a->Hkv, D = a->Dh;
  double *s = (double *)malloc((size_t)(a->Sk ? a->Sk : 1) * sizeof *s);
  double *qi = (double *)malloc((size_t)(2 * D) * sizeof *qi), *acc = qi ? qi + D : NULL;
  if (!s || !qi) return free(s), free(qi), 1;
  for (int64_t b = 0; b < a->B; ++b)
    for (int64_t h = 0; h < a->Hq; ++h)
      for (int64_t i = 0; i < a->Sq; ++i) {
        const int64_t n = fusedk__attn_keys(a, b, i), hk = h / G;
        const int64_t qo = b * a->q.sb + i * a->q.ss + h * a->q.sh, oo = b * a->out.sb + i * a->out.ss + h * a->out.sh;
        double m = -HUGE_VAL, l = 0.0;
        const double *q8 = x8 ? x8[0] + ((b * a->Sq + i) * a->Hq + h) * D : NULL;
        for (int64_t d = 0; d < D; ++d) qi[d] = q8 ? q8[d] : fusedk__load(a->q.p, qo + d, a->scalar), acc[d] = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ko = b * a->k.sb + j * a->k.ss + hk * a->k.sh;
          const double *k8 = x8 ? x8[1] + ((b * a->Sk + j) * a->Hkv + hk) * D : NULL;
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += qi[d] * (k8 ? k8[d] : fusedk__load(a->k.p, ko + d, a->scalar));
          s[j] = (double)a->scale * dot;
          if (s[j] > m) m = s[j];
        }
        for (int64_t j = 0; j < n; ++j) {
          const int64_t vo = b * a->v.sb + j * a->v.ss + hk * a->v.sh;
          const double p = exp(s[j] - m);
          l += p;
          for (int64_t d = 0; d < D; ++d) acc[d] += p * fusedk__load(a->v.p, vo + d, a->scalar);
        }
        for (int64_t d = 0; d < D; ++d) fusedk__store(a->out.p, oo + d, n ? acc[d] / l : 0.0, a->scalar);
        if (a->lse.p) a->lse.p[b * a->lse.sb + h * a->lse.sh + i * a->lse.ss] = n ? (float)(m + log(l)) : -HUGE_VALF;
      }
  free(s), free(qi);
  return 0;
}

/* k's scale to 22 significant bits (its two lowest mantissa bits 0), as the kernel's: its
   conversion of int32 sums needs 1.5 2^23 times the scale exact */
static float fusedk__cut22(float x) {
  uint32_t u;
  memcpy(&u, &x, 4), u &= ~3u, memcpy(&x, &u, 4);
  return x;
}

/* q's or k's rows (b, token, head) quantized and dequantized into out (compact, double); mean:
   per (b, head) Dh floats taken off before (k, its scale cut to 22 bits) and added back after,
   or NULL (q) */
static void fusedk__i8_rows(const fusedk__attn_args *a, const void *p, int64_t sb, int64_t ss, int64_t sh, int64_t S,
                            int64_t H, const float *mean, float *x, double *out) {
  const int64_t D = a->Dh;
  for (int64_t b = 0; b < a->B; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float *mu = mean ? mean + (b * H + h) * D : NULL;
        float amax = 0.0f;
        for (int64_t d = 0; d < D; ++d)
          x[d] = (float)fusedk__load(p, b * sb + i * ss + h * sh + d, a->scalar) - (mu ? mu[d] : 0.0f),
          amax = fusedk__amax(amax, x[d]);
        const float inv = fusedk__q_inv(amax, 127.0f), scale = mu ? fusedk__cut22(amax / 127.0f) : amax / 127.0f;
        double *o = out + ((b * S + i) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = fusedk__i8(x[d], inv, -127.0f) * (double)scale + (mu ? mu[d] : 0.0f);
      }
}

/* attention_int8's reference: q and k quantized as the GPU quantizes them, dequantized into
   double (k with its mean added back: scores shifted by a row's constant, lse as the GPU's), then
   the double reference on them and v */
static int fusedk__attention_int8_cpu(const fusedk__attn_args *a) {
  const int64_t D = a->Dh, nq = a->B * a->Sq * a->Hq * D, nk = a->B * a->Sk * a->Hkv * D;
  double *q = (double *)malloc((size_t)(nq + nk + 1) * sizeof *q), *k = q ? q + nq : NULL;
  float *mean = (float *)malloc((size_t)(a->B * a->Hkv * D + D + 1) * sizeof *mean),
        *x = mean ? mean + a->B * a->Hkv * D : NULL;
  if (!q || !mean) return free(q), free(mean), 1;
  for (int64_t b = 0; b < a->B; ++b)
    for (int64_t h = 0; h < a->Hkv; ++h) { /* k's mean over the keys the last row sees (all that any row sees) */
      const int64_t n = fusedk__attn_keys(a, b, a->Sq - 1), ko = b * a->k.sb + h * a->k.sh;
      float *mu = mean + (b * a->Hkv + h) * D;
      for (int64_t d = 0; d < D; ++d) {
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) sum += fusedk__load(a->k.p, ko + j * a->k.ss + d, a->scalar);
        mu[d] = n ? (float)(sum / (double)n) : 0.0f;
      }
    }
  fusedk__i8_rows(a, a->q.p, a->q.sb, a->q.ss, a->q.sh, a->Sq, a->Hq, NULL, x, q);
  fusedk__i8_rows(a, a->k.p, a->k.sb, a->k.ss, a->k.sh, a->Sk, a->Hkv, mean, x, k);
  const double *x8[2] = {q, k};
  const int r = fusedk__attention_core(a, x8);
  free(q), free(mean);
  return r;
}

/* attention_int8_scaled's reference: dq(q), dq(k) (the scales' magnitudes, k's cut to 22 bits, as
   the kernel reads them) into compact double, then fusedk_attention's reference on them and v */
static int fusedk__attention_scaled_cpu(const fusedk__attn_args *a) {
  const int64_t D = a->Dh, nq = a->B * a->Sq * a->Hq * D, nk = a->B * a->Sk * a->Hkv * D;
  double *x = (double *)malloc((size_t)(nq + nk + 1) * sizeof *x);
  if (!x) return 1;
  for (int t = 0; t < 2; ++t) {
    const int64_t S = t ? a->Sk : a->Sq, H = t ? a->Hkv : a->Hq;
    const int8_t *d8 = (const int8_t *)(t ? a->k.p : a->q.p);
    const int64_t sb = t ? a->k.sb : a->q.sb, ss = t ? a->k.ss : a->q.ss, sh = t ? a->k.sh : a->q.sh;
    const fusedk__attn_scales *sc = t ? &a->ks : &a->qs;
    double *o = t ? x + nq : x;
    for (int64_t b = 0; b < a->B; ++b)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t h = 0; h < H; ++h, o += D) {
          const float f = fabsf(sc->p[b * sc->sb + i * sc->ss + h * sc->sh]);
          const double c = t ? (double)fusedk__cut22(f) : (double)f;
          for (int64_t d = 0; d < D; ++d) o[d] = (double)d8[b * sb + i * ss + h * sh + d] * c;
        }
  }
  const double *x8[2] = {x, x + nq};
  const int r = fusedk__attention_core(a, x8);
  free(x);
  return r;
}

/* a [B, S, H, D] argument's strides over (b, s, h) */
#define FUSEDK__BSH(dst, t) ((dst).sb = fusedk__stride(t, 0), (dst).ss = fusedk__stride(t, 1), (dst).sh = fusedk__stride(t, 2))

/* attention's and attention_int8_scaled's checks past each tensor's own: causal, scale, k's shape
   against q's (q has 4 dims), v's, out's, lse's and kv_len's, out and lse apart from the n
   inputs ins (names); then a's sizes, pointers and strides (a->scalar and the kind left to the
   caller), and kv_len's values where they are in host memory */
static fusedk_status fusedk__attention_common(const fusedk__check *c, const fusedk_tensor *out, const fusedk_tensor *lse,
                                              const fusedk_tensor *q, const fusedk_tensor *k, const fusedk_tensor *v,
                                              const fusedk_tensor *kv_len, float scale, int32_t causal,
                                              const fusedk_tensor *const *ins, const char *const *names, int n,
                                              fusedk__attn_args *a) {
  const char *op = c->op;
  char shp[160];
  fusedk_status st;
  if (causal != 0 && causal != 1)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: causal is %d, expected 0 or 1", op, (int)causal);
  if (!(scale > -HUGE_VALF && scale < HUGE_VALF))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: scale is %g, expected a finite number (0: 1/sqrt(Dh))", op,
                        (double)scale);
  const int64_t B = q->shape[0], Sq = q->shape[1], Hq = q->shape[2], Dh = q->shape[3];
  if (k->ndim != 4 || k->shape[0] != B || k->shape[3] != Dh)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: k has shape %s, expected [B, Sk, Hkv, Dh] with q's B and Dh (%lld, "
                        "%lld)", op, fusedk__shape_str(k, shp, sizeof shp), (long long)B, (long long)Dh);
  if (k->shape[2] < 1 || Hq % k->shape[2])
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: k has %lld heads, expected a divisor of q's %lld (Hq a multiple of "
                        "Hkv: GQA, MQA)", op, (long long)k->shape[2], (long long)Hq);
  const int64_t ls[3] = {B, Hq, Sq};
  if ((st = fusedk__check_shape(c, v, "v", 4, k->shape, "same as k")) ||
      (st = fusedk__check_shape(c, out, "out", 4, q->shape, "same as q")) ||
      (lse && (st = fusedk__check_shape(c, lse, "lse", 3, ls, "[B, Hq, Sq] of q"))) ||
      (kv_len && (st = fusedk__check_shape(c, kv_len, "kv_len", 1, &B, "[B] (q's first dim)"))))
    return st;
  for (int i = 0; i < n; ++i)
    if ((st = fusedk__check_disjoint(c, out, "out", ins[i], names[i])) ||
        (st = fusedk__check_disjoint(c, lse, "lse", ins[i], names[i])))
      return st;
  if ((st = fusedk__check_disjoint(c, out, "out", lse, "lse"))) return st;
  memset(a, 0, sizeof *a);
  a->causal = causal;
  a->scale = scale != 0.0f ? scale : (float)(1.0 / sqrt((double)Dh)); /* the float32 both paths use */
  a->B = B, a->Sq = Sq, a->Sk = k->shape[1], a->Hq = Hq, a->Hkv = k->shape[2], a->Dh = Dh;
  a->q.p = fusedk__base(q), a->k.p = fusedk__base(k), a->v.p = fusedk__base(v), a->out.p = fusedk__base(out);
  FUSEDK__BSH(a->q, q), FUSEDK__BSH(a->k, k), FUSEDK__BSH(a->v, v), FUSEDK__BSH(a->out, out);
  if (lse)
    a->lse.p = (float *)fusedk__base(lse), a->lse.sb = fusedk__stride(lse, 0), a->lse.sh = fusedk__stride(lse, 1),
    a->lse.ss = fusedk__stride(lse, 2);
  if (kv_len) a->kv_len = (const int32_t *)fusedk__base(kv_len), a->kv_stride = fusedk__stride(kv_len, 0);
  for (int64_t b = 0; kv_len && !fusedk__is_gpu(c->dev.device_type) && b < B; ++b)
    if (a->kv_len[b * a->kv_stride] < 0 || a->kv_len[b * a->kv_stride] > a->Sk)
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: kv_len[%lld] is %d, expected 0 to %lld (k's Sk)", op,
                          (long long)b, (int)a->kv_len[b * a->kv_stride], (long long)a->Sk);
  return FUSEDK_OK;
}

/* what the GPU kernels take: 16-bit inputs (ref: the tensor whose dtype is the call's), head
   sizes up to 256 (the int8 kernel's: 64, 128, 256), the grid's blocks */
static fusedk_status fusedk__attention_gpu(const fusedk__check *c, const fusedk__attn_args *a, const char *ref) {
  if (c->scalar == FUSEDK_F32)
    return fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: %s is float32 on a CUDA device; the GPU kernel takes float16 "
                        "and bfloat16 (CPU tensors run the reference in every dtype)", c->op, ref);
  if (a->Dh > 256)
    return fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: q has head size %lld on a CUDA device; the GPU kernel takes "
                        "up to 256", c->op, (long long)a->Dh);
  if (a->int8 && a->Dh != 64 && a->Dh != 128 && a->Dh != 256)
    return fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: q has head size %lld on a CUDA device; the int8 kernel takes "
                        "64, 128 and 256 (attention takes every size up to 256)", c->op, (long long)a->Dh);
  const int64_t blocks = a->B * a->Hq * ((a->Sq + 127) / 128);
  if (blocks > 2147483647)
    return fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: B * Hq * ceil(Sq / 128) is %lld, past the GPU grid's "
                        "2^31 - 1 blocks", c->op, (long long)blocks);
  return FUSEDK_OK;
}

/* The checked call: nothing to do without queries, else the kernel or the CPU reference */
static fusedk_status fusedk__attention_go(const fusedk__check *c, const fusedk__attn_args *a,
                                          struct CUstream_st *stream) {
  if (a->B * a->Sq * a->Hq == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(c->dev.device_type)) return fusedk__cuda_attention(a, c->op, c->dev.device_id, stream);
  const int r = a->scaled ? fusedk__attention_scaled_cpu(a) : a->int8 ? fusedk__attention_int8_cpu(a)
                                                                     : fusedk__attention_core(a, NULL);
  return r ? fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate the reference's buffers", c->op) : FUSEDK_OK;
}

/* attention and attention_int8 (int8 1): checks, then the reference or the kernel */
static fusedk_status fusedk__attention_run(const fusedk_tensor *out, const fusedk_tensor *lse, const fusedk_tensor *q,
                                           const fusedk_tensor *k, const fusedk_tensor *v, const fusedk_tensor *kv_len,
                                           float scale, int32_t causal, int int8, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {out, lse, q, k, v, kv_len};
  const fusedk_op *o = fusedk__op(int8 ? FUSEDK_OP_ATTENTION_INT8 : FUSEDK_OP_ATTENTION);
  const char *op = o->name;
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(o, t, &s);
  if (st) return st;
  const char *names[] = {"q", "k", "v", "kv_len"};
  fusedk__attn_args a;
  if ((st = fusedk__attention_common(&s.c, out, lse, q, k, v, kv_len, scale, causal, t + 2, names, 4, &a)))
    return st;
  a.scalar = s.c.scalar, a.int8 = int8;
  const int64_t B = a.B, Sq = a.Sq, Hq = a.Hq;
  if (fusedk__is_gpu(s.c.dev.device_type)) {
    if ((st = fusedk__attention_gpu(&s.c, &a, "q"))) return st;
    if (int8 && (B * Hq * ((Sq + 31) / 32) > 2147483647 || B * a.Hkv * ((a.Sk + 31) / 32) > 2147483647))
      return fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: B * Hq * ceil(Sq / 32) or B * Hkv * ceil(Sk / 32) past the "
                          "GPU grid's 2^31 - 1 blocks (the quantization passes)", op);
  }
  return fusedk__attention_go(&s.c, &a, stream);
}

FUSEDK_DEF fusedk_status fusedk_attention(const fusedk_tensor *out, const fusedk_tensor *lse, const fusedk_tensor *q,
                                          const fusedk_tensor *k, const fusedk_tensor *v, const fusedk_tensor *kv_len,
                                          float scale, int32_t causal, struct CUstream_st *stream) {
  return fusedk__attention_run(out, lse, q, k, v, kv_len, scale, causal, 0, stream);
}

FUSEDK_DEF fusedk_status fusedk_attention_int8(const fusedk_tensor *out, const fusedk_tensor *lse,
                                               const fusedk_tensor *q, const fusedk_tensor *k, const fusedk_tensor *v,
                                               const fusedk_tensor *kv_len, float scale, int32_t causal,
                                               struct CUstream_st *stream) {
  return fusedk__attention_run(out, lse, q, k, v, kv_len, scale, causal, 1, stream);
}

FUSEDK_DEF fusedk_status fusedk_attention_int8_scaled(const fusedk_tensor *out, const fusedk_tensor *lse,
                                                      const fusedk_scaled_tensor *q, const fusedk_scaled_tensor *k,
                                                      const fusedk_tensor *v, const fusedk_tensor *kv_len,
                                                      float scale, int32_t causal, struct CUstream_st *stream) {
  const fusedk_op *o = fusedk__op(FUSEDK_OP_ATTENTION_INT8_SCALED);
  const char *op = o->name;
  char shp[160];
  if (!q || !k)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is NULL, expected a scaled tensor", op, q ? "k" : "q");
  const fusedk_tensor *t[] = {out, lse, q->data, q->scale, k->data, k->scale, v, kv_len};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(o, t, &s); /* v is the reference: out takes its dtype */
  if (st) return st;
  const fusedk_tensor *qd = q->data, *kd = k->data;
  if (qd->ndim != 4)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: q has shape %s, expected [B, Sq, Hq, Dh]", op,
                        fusedk__shape_str(qd, shp, sizeof shp));
  if ((st = fusedk__check_shape(&s.c, q->scale, "q_scale", 3, qd->shape, "q's [B, Sq, Hq]")) ||
      (kd->ndim == 4 && (st = fusedk__check_shape(&s.c, k->scale, "k_scale", 3, kd->shape, "k's [B, Sk, Hkv]"))))
    return st;
  const char *names[] = {"q", "q_scale", "k", "k_scale", "v", "kv_len"};
  fusedk__attn_args a;
  if ((st = fusedk__attention_common(&s.c, out, lse, qd, kd, v, kv_len, scale, causal, t + 2, names, 6, &a)))
    return st;
  a.scalar = s.c.scalar, a.int8 = 1, a.scaled = 1;
  a.qs.p = (const float *)fusedk__base(q->scale), a.ks.p = (const float *)fusedk__base(k->scale);
  FUSEDK__BSH(a.qs, q->scale), FUSEDK__BSH(a.ks, k->scale);
  if (fusedk__is_gpu(s.c.dev.device_type)) {
    if ((st = fusedk__attention_gpu(&s.c, &a, "v"))) return st;
    for (int i = 2; i < 5; i += 2) { /* TMA reads the int8 rows where they lie (an empty tensor: nothing to read) */
      const fusedk_tensor *d = t[i];
      int ok = (uintptr_t)fusedk__base(d) % 16 == 0, empty = 0;
      for (int j = 0; j < 4; ++j) empty = empty || d->shape[j] == 0;
      for (int j = 0; j < 3; ++j) {
        const int64_t sj = fusedk__stride(d, j);
        ok = ok && (d->shape[j] < 2 || (sj > 0 && sj % 16 == 0));
      }
      if (!ok && !empty)
        return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has base %p and strides (%lld, %lld, %lld) over b, s, h; on a "
                            "CUDA device the base and every stride of a dim past 1 must be positive multiples of 16 "
                            "bytes", op, names[i - 2], fusedk__base(d), (long long)fusedk__stride(d, 0),
                            (long long)fusedk__stride(d, 1), (long long)fusedk__stride(d, 2));
    }
  }
  return fusedk__attention_go(&s.c, &a, stream);
}
#undef FUSEDK__BSH

/* --- [lowrank] CPU reference and entry point ----------------------------------------------- */

/* Per row: h = x v in double, times codes and scaling, then out = beta y + h u_t in double, one
   rounding. y is read before out is written, element by element (out may be y). */
static int fusedk__lowrank_cpu(const fusedk__lowrank_args *a) {
  const int s = a->scalar;
  const int64_t r = a->r, K1 = a->K1, K2 = a->K2;
  double *v = (double *)malloc((size_t)(K1 * r + r * K2 + K1 + r) * sizeof(double) + 1), *u = v + K1 * r,
         *xr = u + r * K2, *h = xr + K1;
  if (!v) return -1;
  fusedk__mat_rows(&a->v, K1, r, s, v);
  fusedk__mat_rows(&a->u_t, r, K2, s, u);
  for (int64_t m = 0; m < a->M; ++m) {
    const fusedk__mat row = {fusedk__mat_row(&a->x, m, s), 0};
    fusedk__mat_rows(&row, 1, K1, s, xr);
    for (int64_t j = 0; j < r; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K1; ++k) acc += xr[k] * v[k * r + j];
      h[j] = (double)a->scaling * acc * (a->codes.p ? fusedk__load(fusedk__mat_row(&a->codes, m, s), j, s) : 1.0);
    }
    void *o = fusedk__mat_row(&a->out, m, s);
    const void *y = a->y.p ? fusedk__mat_row(&a->y, m, s) : NULL;
    for (int64_t n = 0; n < K2; ++n) {
      double acc = y ? (double)a->beta * fusedk__load(y, n, s) : 0.0;
      for (int64_t j = 0; j < r; ++j) acc += h[j] * u[j * K2 + n];
      fusedk__store(o, n, acc, s);
    }
  }
  free(v);
  return 0;
}

/* FUSEDK__LR_CAT and FUSEDK__LR_PREPARE: out's row m = [x's row | h_0 | 0 | h_1 | 0 ...], each
   adapter's slot rp wide (zeros past r): h_q = (x a_q^T) * codes in double (v holds a [A, r, K1]),
   0 for an adapter the row's id does not select; or scaling times b_q's row m. Rounded once. */
static int fusedk__lowrank_cat_cpu(const fusedk__lowrank_args *a) {
  const int s = a->scalar, cat = a->mode == FUSEDK__LR_CAT;
  const int64_t r = a->r, K1 = a->K1, rp = (r + 7) / 8 * 8, A = a->slots, nv = cat ? A * r * K1 : 0;
  double *v = (double *)malloc((size_t)(nv + K1 + A * r) * sizeof(double) + 1), *xr = v + nv, *h = xr + K1;
  if (!v) return -1;
  fusedk__mat vq[128]; /* adapter q's rows (A <= 128) */
  for (int64_t q = 0; q < A; ++q)
    vq[q].p = (void *)((uintptr_t)a->v.p + (uintptr_t)(q * a->va * (int64_t)fusedk__scalar_size(s))), vq[q].ld = a->v.ld;
  for (int64_t q = 0; cat && q < A; ++q) fusedk__mat_rows(&vq[q], r, K1, s, v + q * r * K1);
  for (int64_t m = 0; m < a->M; ++m) {
    const fusedk__mat row = {fusedk__mat_row(&a->x, m, s), 0};
    fusedk__mat_rows(&row, 1, K1, s, xr);
    for (int64_t q = 0; q < A; ++q) {
      const fusedk__mat brow = {cat ? NULL : fusedk__mat_row(&vq[q], m, s), 0};
      if (!cat) fusedk__mat_rows(&brow, 1, r, s, h + q * r);
      for (int64_t j = 0; j < r; ++j) {
        double acc = 0.0;
        const int on = !a->ids || a->ids[m] == q;
        for (int64_t k = 0; cat && on && k < K1; ++k) acc += xr[k] * v[(q * r + j) * K1 + k];
        h[q * r + j] = !cat ? (double)a->scaling * h[q * r + j]
                       : on ? acc * (a->codes.p ? fusedk__load(fusedk__mat_row(&a->codes, m, s), j, s) : 1.0) : 0.0;
      }
    }
    void *o = fusedk__mat_row(&a->out, m, s);
    for (int64_t k = 0; a->out.p != a->x.p && k < K1; ++k) /* (x with room for h: already there) */
      fusedk__store(o, k, xr[k], s);
    for (int64_t j = 0; j < A * rp; ++j) fusedk__store(o, K1 + j, j % rp < r ? h[j / rp * r + j % rp] : 0.0, s);
  }
  free(v);
  return 0;
}

/* the same view: one base, shape and strides (an in-place output) */
static int fusedk__same_view(const fusedk_tensor *a, const fusedk_tensor *b) {
  if (a->ndim != b->ndim || fusedk__base(a) != fusedk__base(b)) return 0;
  for (int i = 0; i < a->ndim; ++i)
    if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && fusedk__stride(a, i) != fusedk__stride(b, i))) return 0;
  return 1;
}

FUSEDK_DEF fusedk_status fusedk_lowrank_update(const fusedk_tensor *out, const fusedk_tensor *x, const fusedk_tensor *v,
                                               const fusedk_tensor *codes, const fusedk_tensor *u_t,
                                               const fusedk_tensor *y, float scaling, float beta,
                                               struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {out, x, v, codes, u_t, y};
  const char *op = "lowrank_update";
  char shp[160];
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LOWRANK_UPDATE), t, &s);
  if (st) return st;
  const float num[2] = {scaling, beta};
  for (int i = 0; i < 2; ++i)
    if (!(num[i] > -HUGE_VALF && num[i] < HUGE_VALF))
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is %g, expected a finite number", op,
                          i ? "beta" : "scaling", (double)num[i]);
  const int64_t K1 = x->shape[x->ndim - 1];
  if (v->ndim != 2 || v->shape[0] != K1 || v->shape[1] < 1 || v->shape[1] > 128)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: v has shape %s, expected [K1, r] with K1 = %lld (the last dim of x) "
                        "and a rank r of 1..128", op, fusedk__shape_str(v, shp, sizeof shp), (long long)K1);
  const int64_t r = v->shape[1];
  if (u_t->ndim != 2 || u_t->shape[0] != r)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: u_t has shape %s, expected [r, K2] with r = %lld (the last dim of v)",
                        op, fusedk__shape_str(u_t, shp, sizeof shp), (long long)r);
  fusedk__lowrank_args a;
  memset(&a, 0, sizeof a);
  a.scalar = s.c.scalar, a.r = (int32_t)r, a.scaling = scaling, a.beta = beta;
  a.K1 = K1, a.K2 = u_t->shape[1];
  a.M = 1;
  for (int i = 0; i < x->ndim - 1; ++i) a.M *= x->shape[i];
  if ((st = fusedk__linear_2d(&s.c, v, "v", &a.v)) || (st = fusedk__linear_2d(&s.c, u_t, "u_t", &a.u_t)) ||
      (st = fusedk__linear_rows(&s.c, x, "x", x, "x", K1, &a.x)) ||
      (codes && (st = fusedk__linear_rows(&s.c, codes, "codes", x, "x", r, &a.codes))) ||
      (y && (st = fusedk__linear_rows(&s.c, y, "y", x, "x", a.K2, &a.y))) ||
      (st = fusedk__linear_rows(&s.c, out, "out", x, "x", a.K2, &a.out)))
    return st;
  const fusedk_tensor *ins[] = {x, v, codes, u_t, y};
  const char *names[] = {"x", "v", "codes", "u_t", "y"};
  for (int i = 0; i < 5; ++i)
    if ((i < 4 || (y && !fusedk__same_view(out, y))) && (st = fusedk__check_disjoint(&s.c, out, "out", ins[i], names[i])))
      return i < 4 ? st : fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: out overlaps y in memory, expected separate buffers "
                                       "or the same view (in place)", op);
  if (beta == 0.0f) a.y.p = NULL; /* not read */
  if (a.M == 0 || a.K2 == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s.c.dev.device_type)) return fusedk__cuda_lowrank(&a, op, s.c.dev.device_id, stream);
  return fusedk__lowrank_cpu(&a) ? fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate the reference's "
                                                "buffers", op)
                                 : FUSEDK_OK;
}

/* A LoRA factor, one adapter's [d0, d1] or A stacked [A, d0, d1]: dim rank_dim (0 or 1) of the
   matrix is the rank (1..128, and A rp <= 128 columns of h), the other must be `other`. Gives A,
   r, the first adapter's rows (p, row stride) and the adapter stride. */
static fusedk_status fusedk__lora_factor(const fusedk__check *c, const fusedk_tensor *t, const char *name, int rank_dim,
                                         int64_t other, const char *want, fusedk__lowrank_args *la, fusedk__mat *m) {
  char shp[160];
  const int o = t->ndim - 2;
  if ((o != 0 && o != 1) || t->shape[o + 1 - rank_dim] != other || t->shape[o + rank_dim] < 1 ||
      t->shape[o + rank_dim] > 128 || (o == 1 && t->shape[0] < 1))
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s, expected %s = %lld and a rank r of 1..128 (or A of "
                        "those stacked: [A, ...])", c->op, name, fusedk__shape_str(t, shp, sizeof shp), want,
                        (long long)other);
  const int64_t A = o ? t->shape[0] : 1, r = t->shape[o + rank_dim];
  if (A * ((r + 7) / 8 * 8) > 128)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has shape %s: %lld adapters of rank %lld make %lld columns of h, "
                        "expected at most 128 (A times r rounded up to 8)", c->op, name,
                        fusedk__shape_str(t, shp, sizeof shp), (long long)A, (long long)r, (long long)(A * ((r + 7) / 8 * 8)));
  la->slots = (int32_t)A, la->r = (int32_t)r;
  la->va = A > 1 ? fusedk__stride(t, 0) : 0;
  m->p = fusedk__base(t);
  m->ld = t->shape[o] > 1 ? fusedk__stride(t, o) : t->shape[o + 1];
  if (m->ld < t->shape[o + 1])
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has a row stride of %lld elements, expected >= %lld", c->op, name,
                        (long long)m->ld, (long long)t->shape[o + 1]);
  return FUSEDK_OK;
}

/* adapter_ids, when given: int32 [M] (x's rows, flattened), contiguous */
static fusedk_status fusedk__check_ids(const fusedk__check *c, const fusedk_tensor *ids, int64_t M) {
  fusedk_status st;
  if (!ids) return FUSEDK_OK;
  if ((st = fusedk__check_shape(c, ids, "adapter_ids", 1, &M, "[M] (x's rows, flattened)"))) return st;
  if (M > 1 && fusedk__stride(ids, 0) != 1)
    return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: adapter_ids has stride %lld, expected a contiguous [M]", c->op,
                        (long long)fusedk__stride(ids, 0));
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_lowrank_prepare(const fusedk_tensor *w_cat, const fusedk_tensor *w,
                                                const fusedk_tensor *b, float scaling, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {w_cat, w, b};
  char shp[160];
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LOWRANK_PREPARE), t, &s);
  if (st) return st;
  if (!(scaling > -HUGE_VALF && scaling < HUGE_VALF))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: scaling is %g, expected a finite number", s.c.op,
                        (double)scaling);
  if (w->ndim != 2)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: w has shape %s, expected [N, K]", s.c.op,
                        fusedk__shape_str(w, shp, sizeof shp));
  fusedk__lowrank_args a;
  memset(&a, 0, sizeof a);
  if ((st = fusedk__lora_factor(&s.c, b, "b", 1, w->shape[0], "[N, r] with N (w's rows)", &a, &a.v))) return st;
  a.mode = FUSEDK__LR_PREPARE, a.scalar = s.c.scalar, a.scaling = scaling;
  a.M = w->shape[0], a.K1 = w->shape[1];
  const int64_t want[2] = {a.M, a.K1 + a.slots * ((a.r + 7) / 8 * 8)};
  if ((st = fusedk__check_shape(&s.c, w_cat, "w_cat", 2, want, "[N, K + A r], r rounded up to 8")) ||
      (st = fusedk__linear_2d(&s.c, w, "w", &a.x)) ||
      (st = fusedk__linear_2d(&s.c, w_cat, "w_cat", &a.out)) ||
      (st = fusedk__check_disjoint(&s.c, w_cat, "w_cat", w, "w")) ||
      (st = fusedk__check_disjoint(&s.c, w_cat, "w_cat", b, "b")))
    return st;
  if (a.M == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s.c.dev.device_type)) return fusedk__cuda_lowrank(&a, s.c.op, s.c.dev.device_id, stream);
  return fusedk__lowrank_cat_cpu(&a) ? fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate the reference's "
                                                    "buffers", s.c.op)
                                     : FUSEDK_OK;
}

/* Whether x [..., K + A rp] has room for h beside a's K columns (a [r, K] or [A, r, K]): then xv
   is x's view of its first K columns (its shape and strides in xs: 2 FUSEDK_MAX_DIMS), else xv
   stays x */
static int fusedk__lora_room(const fusedk_tensor *x, const fusedk_tensor *a, fusedk_tensor *xv, int64_t *xs) {
  if (!a || !a->shape || (a->ndim != 2 && a->ndim != 3) || !x->shape || x->ndim < 1 || x->ndim > FUSEDK_MAX_DIMS)
    return 0;
  const int64_t K = a->shape[a->ndim - 1], r = a->shape[a->ndim - 2], A = a->ndim == 3 ? a->shape[0] : 1;
  if (K < 0 || r < 1 || r > 128 || A < 1 || A > 128 || x->shape[x->ndim - 1] != K + A * ((r + 7) / 8 * 8)) return 0;
  int64_t *shape = xs, *strides = xs + FUSEDK_MAX_DIMS;
  for (int i = 0; i < x->ndim; ++i) /* explicit strides: a compact x's are not the narrower view's */
    shape[i] = x->shape[i], strides[i] = fusedk__stride(x, i);
  shape[x->ndim - 1] = K;
  xv->shape = shape, xv->strides = strides;
  return 1;
}

FUSEDK_DEF fusedk_status fusedk_linear_lowrank(const fusedk_tensor *y, const fusedk_tensor *aux_out,
                                               const fusedk_tensor *x, const fusedk_tensor *w_cat,
                                               const fusedk_tensor *bias, const fusedk_tensor *a,
                                               const fusedk_tensor *codes, const fusedk_tensor *adapter_ids,
                                               fusedk_activation act, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, aux_out, x, w_cat, bias, a, codes, adapter_ids};
  fusedk__rowset s;
  fusedk__linear_args l;
  fusedk__lowrank_args h;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LINEAR_LOWRANK), t, &s);
  if (st) return st;
  /* x with room for h: [..., K + A rp] with K a's last dim; checked below as its first K columns */
  int64_t xs[2 * FUSEDK_MAX_DIMS];
  fusedk_tensor xv = *x;
  const int room = fusedk__lora_room(x, a, &xv, xs);
  x = &xv;
  const int64_t K = x->shape[x->ndim - 1];
  memset(&h, 0, sizeof h);
  if ((st = fusedk__lora_factor(&s.c, a, "a", 0, K, "[r, K] with K (the last dim of x, or of x [..., K + A rp]: x "
                                "with room for h)", &h, &h.v)))
    return st;
  const int64_t r = h.r, W = h.slots * ((r + 7) / 8 * 8);
  if ((st = fusedk__linear_common(&s.c, (int)act, 0, x, w_cat, W, &l))) return st;
  l.op = FUSEDK_OP_LINEAR;
  h.mode = FUSEDK__LR_CAT, h.scalar = s.c.scalar, h.scaling = 1.0f, h.M = l.M, h.K1 = K;
  if ((bias && (st = fusedk__check_shape(&s.c, bias, "bias", 1, &l.N, "[N] (the first dim of w_cat)"))) ||
      /* with room, x's rows as the whole K + W wide tensor: h is written and the GEMM reads there */
      (st = fusedk__linear_rows(&s.c, room ? t[2] : x, "x", room ? t[2] : x, "x", room ? K + W : K, &h.x)) ||
      (codes && (st = fusedk__linear_rows(&s.c, codes, "codes", x, "x", r, &h.codes))) ||
      (st = fusedk__linear_rows(&s.c, y, "y", x, "x", l.N, &l.y)) ||
      (aux_out && (st = fusedk__linear_rows(&s.c, aux_out, "aux_out", x, "x", l.N, &l.aux))) ||
      (st = fusedk__check_ids(&s.c, adapter_ids, l.M)))
    return st;
  const fusedk_tensor *ins[] = {t[2], w_cat, bias, a, codes, adapter_ids, aux_out}; /* x whole, room too */
  const char *names[] = {"x", "w_cat", "bias", "a", "codes", "adapter_ids", "aux_out"};
  for (int i = 0; i < 7; ++i)
    if ((st = fusedk__check_disjoint(&s.c, y, "y", ins[i], names[i])) ||
        (i < 6 && (st = fusedk__check_disjoint(&s.c, aux_out, "aux_out", ins[i], names[i]))) ||
        (room && i > 0 && i < 6 &&
         (st = fusedk__check_disjoint(&s.c, t[2], "x (with room for h)", ins[i], names[i]))))
      return st;
  l.bias = fusedk__base(bias);
  h.ids = adapter_ids ? (const int32_t *)fusedk__base(adapter_ids) : NULL;
  if (l.M == 0 || l.N == 0) return FUSEDK_OK;
  if (room) h.out = h.x; /* [x | h] is x's own rows */
  if (fusedk__is_gpu(s.c.dev.device_type))
    return fusedk__cuda_linear_lowrank(&l, &h, s.c.op, s.c.dev.device_id, stream);
  /* [x | h] (into a host buffer unless x has the room), then linear's reference on it */
  const int64_t ld = K + W;
  void *xc = room ? NULL : malloc((size_t)(l.M * ld) * fusedk__scalar_size(s.c.scalar) + 1);
  if (!room) h.out.p = xc, h.out.ld = ld;
  l.x = h.out;
  const int fail = (!room && !xc) || fusedk__lowrank_cat_cpu(&h) || fusedk__linear_cpu(&l);
  free(xc);
  return fail ? fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate the reference's buffers", s.c.op)
              : FUSEDK_OK;
}

/* The backward's reference (the formulas above linear_lowrank's declaration), a row at a time in
   double: P, Q (and w) converted once, dz rounded to the dtype as linear_backward's; dv / da,
   du_t / db and dbias summed over the rows; every output rounded once. */
static int fusedk__lowrank_grad_cpu(const fusedk__lowrank_grad_args *a) {
  const int s = a->scalar, lora = a->lora;
  const int64_t r = a->r, A = a->slots, K = a->K, N = a->N, R = A * r, rp = (r + 7) / 8 * 8, W = lora ? N * K : 0;
  double *P = (double *)malloc((size_t)(2 * R * (K + N) + W + K + 2 * N + 3 * R + r) * sizeof(double) + 1);
  if (!P) return -1;
  double *Q = P + R * K, *dP = Q + R * N, *dQ = dP + R * K, *w = dQ + R * N, *xr = w + W, *dz = xr + K;
  double *db = dz + N, *dh = db + N, *g = dh + R, *hq = g + R, *dc = hq + R;
  memset(dP, 0, (size_t)(R * (K + N)) * sizeof(double));
  memset(db, 0, (size_t)N * sizeof(double));
  const size_t es = fusedk__scalar_size(s);
  for (int64_t q = 0; q < A; ++q) { /* P[q r + j][k] = P_q[k, j], Q[q r + j][n] = Q_q[n, j] */
    const fusedk__mat pq = {(void *)((uintptr_t)a->p.p + (uintptr_t)(q * a->pa) * es), a->p.ld};
    for (int64_t j = 0; j < r; ++j) {
      for (int64_t k = 0; k < K; ++k)
        P[(q * r + j) * K + k] = lora ? fusedk__load(fusedk__mat_row(&pq, j, s), k, s)
                                      : fusedk__load(fusedk__mat_row(&pq, k, s), j, s);
      for (int64_t n = 0; n < N; ++n)
        Q[(q * r + j) * N + n] = lora ? fusedk__load(fusedk__mat_row(&a->q, n, s), K + q * rp + j, s)
                                      : (double)a->scaling * fusedk__load(fusedk__mat_row(&a->q, j, s), n, s);
    }
  }
  if (lora) fusedk__mat_rows(&a->q, N, K, s, w);
  for (int64_t m = 0; m < a->M; ++m) {
    const fusedk__mat xm = {fusedk__mat_row(&a->x, m, s), 0}, dym = {fusedk__mat_row(&a->dy, m, s), 0};
    fusedk__mat_rows(&xm, 1, K, s, xr);
    fusedk__mat_rows(&dym, 1, N, s, dz);
    for (int64_t n = 0; a->act != FUSEDK_ACT_NONE && n < N; ++n)
      dz[n] = fusedk__round(dz[n] * fusedk__act_grad_f64(fusedk__load(fusedk__mat_row(&a->aux, m, s), n, s), a->act), s);
    for (int64_t j = 0; j < r; ++j) dc[j] = 0.0;
    for (int64_t q = 0; q < A; ++q) {
      const int on = !a->ids || a->ids[m] == q;
      for (int64_t j = 0, i = q * r; j < r; ++j, ++i) {
        double h = 0.0, dg = 0.0;
        for (int64_t k = 0; on && k < K; ++k) h += xr[k] * P[i * K + k];
        for (int64_t n = 0; on && n < N; ++n) dg += dz[n] * Q[i * N + n];
        const double c = a->codes.p ? fusedk__load(fusedk__mat_row(&a->codes, m, s), j, s) : 1.0;
        hq[i] = h, dc[j] += dg * h, dh[i] = dg * c, g[i] = h * c;
        for (int64_t k = 0; k < K; ++k) dP[i * K + k] += xr[k] * dh[i];
        for (int64_t n = 0; n < N; ++n) dQ[i * N + n] += (double)a->scaling * g[i] * dz[n];
      }
    }
    for (int64_t k = 0; a->dx.p && k < K; ++k) {
      double acc = 0.0;
      for (int64_t i = 0; i < R; ++i) acc += dh[i] * P[i * K + k];
      for (int64_t n = 0; lora && n < N; ++n) acc += dz[n] * w[n * K + k];
      fusedk__store(fusedk__mat_row(&a->dx, m, s), k, acc, s);
    }
    for (int64_t j = 0; a->dcodes.p && j < r; ++j) fusedk__store(fusedk__mat_row(&a->dcodes, m, s), j, dc[j], s);
    for (int64_t n = 0; n < N; ++n) db[n] += dz[n];
  }
  for (int64_t q = 0; q < A; ++q) { /* dv[k, j] / da_q[j, k]; du_t[j, n] / db_q[n, j] */
    const fusedk__mat dpq = {(void *)((uintptr_t)a->dp.p + (uintptr_t)(q * a->dpa) * es), a->dp.ld};
    const fusedk__mat dqq = {(void *)((uintptr_t)a->dq.p + (uintptr_t)(q * a->dqa) * es), a->dq.ld};
    for (int64_t j = 0, i = q * r; j < r; ++j, ++i) {
      for (int64_t k = 0; a->dp.p && k < K; ++k)
        fusedk__store(lora ? fusedk__mat_row(&dpq, j, s) : fusedk__mat_row(&dpq, k, s), lora ? k : j, dP[i * K + k], s);
      for (int64_t n = 0; a->dq.p && n < N; ++n)
        fusedk__store(lora ? fusedk__mat_row(&dqq, n, s) : fusedk__mat_row(&dqq, j, s), lora ? j : n, dQ[i * N + n], s);
    }
  }
  for (int64_t n = 0; a->dbias && n < N; ++n) fusedk__store(a->dbias, n, db[n], s);
  free(P);
  return 0;
}

/* The outputs against every input and each other: a GEMM reads its inputs while it writes. */
static fusedk_status fusedk__grad_disjoint(const fusedk__check *c, const fusedk_tensor *const *t, const char *const *names,
                                          int n_out, int n) {
  fusedk_status st = FUSEDK_OK;
  for (int i = 0; i < n_out && !st; ++i)
    for (int j = i + 1; j < n && !st; ++j) st = fusedk__check_disjoint(c, t[i], names[i], t[j], names[j]);
  return st;
}

static fusedk_status fusedk__grad_run(const fusedk__lowrank_grad_args *a, const fusedk__check *c,
                                      struct CUstream_st *stream) {
  if (fusedk__is_gpu(c->dev.device_type)) return fusedk__cuda_lowrank_grad(a, c->op, c->dev.device_id, stream);
  return fusedk__lowrank_grad_cpu(a) ? fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate the reference's "
                                                    "buffers", c->op)
                                     : FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_lowrank_update_backward(const fusedk_tensor *dx, const fusedk_tensor *dv,
                                                        const fusedk_tensor *du_t, const fusedk_tensor *dcodes,
                                                        const fusedk_tensor *dout, const fusedk_tensor *x,
                                                        const fusedk_tensor *v, const fusedk_tensor *codes,
                                                        const fusedk_tensor *u_t, float scaling,
                                                        struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {dx, dv, du_t, dcodes, dout, x, v, codes, u_t};
  const char *names[] = {"dx", "dv", "du_t", "dcodes", "dout", "x", "v", "codes", "u_t"};
  char shp[160];
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LOWRANK_UPDATE_BACKWARD), t, &s);
  if (st) return st;
  if (!(scaling > -HUGE_VALF && scaling < HUGE_VALF))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: scaling is %g, expected a finite number", s.c.op,
                        (double)scaling);
  const int64_t K = x->shape[x->ndim - 1];
  if (v->ndim != 2 || v->shape[0] != K || v->shape[1] < 1 || v->shape[1] > 128)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: v has shape %s, expected [K1, r] with K1 = %lld (the last dim of x) "
                        "and a rank r of 1..128", s.c.op, fusedk__shape_str(v, shp, sizeof shp), (long long)K);
  const int64_t r = v->shape[1];
  if (u_t->ndim != 2 || u_t->shape[0] != r)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: u_t has shape %s, expected [r, K2] with r = %lld (the last dim of v)",
                        s.c.op, fusedk__shape_str(u_t, shp, sizeof shp), (long long)r);
  fusedk__lowrank_grad_args a;
  memset(&a, 0, sizeof a);
  a.scalar = s.c.scalar, a.act = FUSEDK_ACT_NONE, a.r = (int32_t)r, a.slots = 1, a.scaling = scaling;
  a.K = K, a.N = u_t->shape[1], a.M = 1;
  for (int i = 0; i < x->ndim - 1; ++i) a.M *= x->shape[i];
  if ((st = fusedk__linear_2d(&s.c, v, "v", &a.p)) || (st = fusedk__linear_2d(&s.c, u_t, "u_t", &a.q)) ||
      (st = fusedk__linear_rows(&s.c, x, "x", x, "x", K, &a.x)) ||
      (st = fusedk__linear_rows(&s.c, dout, "dout", x, "x", a.N, &a.dy)) ||
      (codes && (st = fusedk__linear_rows(&s.c, codes, "codes", x, "x", r, &a.codes))) ||
      (dx && (st = fusedk__linear_rows(&s.c, dx, "dx", x, "x", K, &a.dx))) ||
      (dcodes && (st = fusedk__linear_rows(&s.c, dcodes, "dcodes", x, "x", r, &a.dcodes))) ||
      (dv && (st = fusedk__linear_2d(&s.c, dv, "dv", &a.dp))) || (du_t && (st = fusedk__linear_2d(&s.c, du_t, "du_t", &a.dq))) ||
      (st = fusedk__grad_disjoint(&s.c, t, names, 4, 9)))
    return st;
  if (!dx && !dv && !du_t && !dcodes) return FUSEDK_OK;
  return fusedk__grad_run(&a, &s.c, stream);
}

FUSEDK_DEF fusedk_status fusedk_linear_lowrank_backward(const fusedk_tensor *dx, const fusedk_tensor *da,
                                                        const fusedk_tensor *db, const fusedk_tensor *dcodes,
                                                        const fusedk_tensor *dbias, const fusedk_tensor *dy,
                                                        const fusedk_tensor *x, const fusedk_tensor *w_cat,
                                                        const fusedk_tensor *a, const fusedk_tensor *codes,
                                                        const fusedk_tensor *adapter_ids, const fusedk_tensor *aux,
                                                        fusedk_activation act, float scaling,
                                                        struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {dx, da, db, dcodes, dbias, dy, x, w_cat, a, codes, adapter_ids, aux};
  const char *names[] = {"dx", "da", "db", "dcodes", "dbias", "dy", "x", "w_cat", "a", "codes", "adapter_ids", "aux"};
  fusedk__rowset s;
  fusedk__linear_args l;
  fusedk__lowrank_args f, fd;
  fusedk__lowrank_grad_args g;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_LINEAR_LOWRANK_BACKWARD), t, &s);
  if (st) return st;
  if (!(scaling > -HUGE_VALF && scaling < HUGE_VALF))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: scaling is %g, expected a finite number", s.c.op,
                        (double)scaling);
  const int64_t K = x->shape[x->ndim - 1];
  memset(&f, 0, sizeof f);
  memset(&g, 0, sizeof g);
  if ((st = fusedk__lora_factor(&s.c, a, "a", 0, K, "[r, K] with K (the last dim of x)", &f, &g.p))) return st;
  const int64_t r = f.r, A = f.slots;
  if ((st = fusedk__linear_common(&s.c, (int)act, 0, x, w_cat, A * ((r + 7) / 8 * 8), &l))) return st;
  if (act != FUSEDK_ACT_NONE && !aux)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: aux is NULL, expected the forward's aux_out (its "
                        "pre-activation; for RELU its y will do) since act is not NONE", s.c.op);
  g.lora = 1, g.scalar = s.c.scalar, g.act = (int32_t)act, g.r = (int32_t)r, g.slots = (int32_t)A;
  g.scaling = scaling, g.M = l.M, g.K = K, g.N = l.N, g.pa = f.va, g.q = l.w;
  int64_t bshape[3] = {A, l.N, r};
  if ((st = fusedk__linear_rows(&s.c, x, "x", x, "x", K, &g.x)) ||
      (st = fusedk__linear_rows(&s.c, dy, "dy", x, "x", l.N, &g.dy)) ||
      (aux && (st = fusedk__linear_rows(&s.c, aux, "aux", x, "x", l.N, &g.aux))) ||
      (codes && (st = fusedk__linear_rows(&s.c, codes, "codes", x, "x", r, &g.codes))) ||
      (st = fusedk__check_ids(&s.c, adapter_ids, l.M)) ||
      (dx && (st = fusedk__linear_rows(&s.c, dx, "dx", x, "x", K, &g.dx))) ||
      (dcodes && (st = fusedk__linear_rows(&s.c, dcodes, "dcodes", x, "x", r, &g.dcodes))) ||
      (da && (st = fusedk__lora_factor(&s.c, da, "da", 0, K, "a's", &fd, &g.dp))) ||
      (db && (st = fusedk__check_shape(&s.c, db, "db", a->ndim, bshape + 3 - a->ndim, "b's: a's adapters, w_cat's "
                                       "N, a's rank"))) ||
      (db && (st = fusedk__lora_factor(&s.c, db, "db", 1, l.N, "[N, r]", &fd, &g.dq))) ||
      (dbias && (st = fusedk__check_shape(&s.c, dbias, "dbias", 1, &l.N, "[N] (the first dim of w_cat)"))) ||
      (st = fusedk__grad_disjoint(&s.c, t, names, 5, 12)))
    return st;
  if (da) g.dpa = A > 1 ? fusedk__stride(da, 0) : 0;
  if (db) g.dqa = A > 1 ? fusedk__stride(db, 0) : 0;
  const int64_t span[2] = {r * g.dp.ld, l.N * g.dq.ld}; /* an adapter's rows: r of da's, N of db's */
  const int64_t astride[2] = {g.dpa, g.dqa};
  for (int i = 0; i < 2; ++i) /* stacked outputs: each adapter's rows apart from the next one's */
    if ((i ? db : da) && A > 1 && span[i] > 0 && (astride[i] < 0 ? -astride[i] : astride[i]) < span[i])
      return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has an adapter stride of %lld elements, expected >= %lld (its "
                          "adapters' rows may not overlap)", s.c.op, i ? "db" : "da", (long long)astride[i],
                          (long long)span[i]);
  g.ids = adapter_ids ? (const int32_t *)fusedk__base(adapter_ids) : NULL;
  g.dbias = fusedk__base(dbias);
  if (!dx && !da && !db && !dcodes && !dbias) return FUSEDK_OK;
  return fusedk__grad_run(&g, &s.c, stream);
}

/* --- [conv] CPU references and entry points ------------------------------------------------ */

/* conv: w converted to double once ([Co][taps Ci]), then per output pixel its receptive field
   gathered in double (zeros outside, the clamped frame or pixel for replicated padding) and one dot
   product a channel, accumulated in double and rounded once. */
static int fusedk__conv_cpu(const fusedk__conv_args *a) {
  const int s = a->scalar;
  const int64_t taps = a->kt * a->kh * a->kw, K = taps * a->Ci, es = (int64_t)fusedk__scalar_size(s);
  double *w = (double *)malloc((size_t)(a->Co * K + K) * sizeof(double) + 1), *f = w + a->Co * K;
  if (!w) return -1;
  for (int64_t co = 0; co < a->Co; ++co)
    for (int64_t i = 0, k = 0; i < a->kt; ++i)
      for (int64_t j = 0; j < a->kh; ++j)
        for (int64_t l = 0; l < a->kw; ++l, k += a->Ci) {
          const char *row = (const char *)a->w + es * (co * a->ws[0] + i * a->ws[1] + j * a->ws[2] + l * a->ws[3]);
          for (int64_t c = 0; c < a->Ci; ++c) w[co * K + k + c] = fusedk__load(row, c, s);
        }
  for (int64_t n = 0; n < a->N; ++n)
    for (int64_t t = 0; t < a->To; ++t)
      for (int64_t h = 0; h < a->Ho; ++h)
        for (int64_t x = 0; x < a->Wo; ++x) {
          for (int64_t i = 0, k = 0; i < a->kt; ++i)
            for (int64_t j = 0; j < a->kh; ++j)
              for (int64_t l = 0; l < a->kw; ++l, k += a->Ci) {
                int64_t ti = t * a->stride_t + i - a->pad_t, hi = h * a->stride + j - a->pad;
                int64_t wi = x * a->stride + l - a->pad;
                if (a->replicate & 1) ti = ti < 0 ? 0 : ti >= a->T ? a->T - 1 : ti;
                if (a->replicate & 2) {
                  hi = hi < 0 ? 0 : hi >= a->H ? a->H - 1 : hi;
                  wi = wi < 0 ? 0 : wi >= a->W ? a->W - 1 : wi;
                }
                const int in = ti >= 0 && ti < a->T && hi >= 0 && hi < a->H && wi >= 0 && wi < a->W;
                const char *row = (const char *)a->x + es * (n * a->xs[0] + ti * a->xs[1] + hi / a->up * a->xs[2] +
                                                             wi / a->up * a->xs[3]);
                for (int64_t c = 0; c < a->Ci; ++c) f[k + c] = in ? fusedk__load(row, c, s) : 0.0;
              }
          char *o = (char *)a->out + es * (n * a->os[0] + t * a->os[1] + h * a->os[2] + x * a->os[3]);
          const char *r = a->res ? (const char *)a->res + es * (n * a->rs[0] + t * a->rs[1] + h * a->rs[2] + x * a->rs[3])
                                 : NULL;
          for (int64_t co = 0; co < a->Co; ++co) {
            double z = a->bias ? fusedk__load(a->bias, co, s) : 0.0;
            for (int64_t k = 0; k < K; ++k) z += f[k] * w[co * K + k];
            if (a->act != FUSEDK_ACT_NONE) z = fusedk__act_f64(z, a->act);
            fusedk__store(o, co, r ? z + fusedk__load(r, co, s) : z, s);
          }
        }
  free(w);
  return 0;
}

/* A tensor's strides of its leading dims as [n, t, h, w] (an image's t: 0) */
static void fusedk__conv_strides(const fusedk_tensor *t, int64_t *st) {
  const int v = t->ndim == 5;
  st[0] = fusedk__stride(t, 0), st[1] = v ? fusedk__stride(t, 1) : 0;
  st[2] = fusedk__stride(t, 1 + v), st[3] = fusedk__stride(t, 2 + v);
}

FUSEDK_DEF fusedk_status fusedk_conv(const fusedk_tensor *out, const fusedk_tensor *x, const fusedk_tensor *w,
                                     const fusedk_tensor *bias, const fusedk_tensor *residual, int32_t stride,
                                     int32_t padding, int32_t stride_t, int32_t pad_t, int32_t pad_t_back,
                                     int32_t replicate, fusedk_activation act, int32_t upsample,
                                     struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {out, x, w, bias, residual};
  const double at[] = {(double)stride, (double)padding, (double)stride_t, (double)pad_t, (double)pad_t_back,
                       (double)replicate, (double)act, (double)upsample};
  fusedk__rowset s;
  fusedk__conv_args a;
  memset(&a, 0, sizeof a);
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_CONV), t, &s);
  if (st || (st = fusedk__conv_geometry(s.c.op, x, w, at, &a))) return st;
  const int v = x->ndim == 5;
  int64_t os[5] = {a.N, a.To, a.Ho, a.Wo, a.Co}, *o = v ? os : os + 1;
  if (!v) o[0] = a.N;
  if ((st = fusedk__check_shape(&s.c, out, "out", x->ndim, o, "x's images with w's channels: see fusedk_conv")) ||
      (residual && (st = fusedk__check_shape(&s.c, residual, "residual", x->ndim, o, "out's shape"))) ||
      (bias && (st = fusedk__check_shape(&s.c, bias, "bias", 1, &a.Co, "[Co] (the first dim of w)"))))
    return st;
  const char *names[] = {"out", "x", "w", "bias", "residual"};
  for (int i = 1; i < 5; ++i)
    if ((st = fusedk__check_disjoint(&s.c, out, "out", t[i], names[i]))) return st;
  if (fusedk__is_gpu(s.c.dev.device_type) && s.c.scalar == FUSEDK_F32)
    return fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: x is float32 on a GPU, expected float16 or bfloat16 (the "
                        "tensor cores' conv; float32 runs on the CPU)", s.c.op);
  a.scalar = s.c.scalar;
  a.x = fusedk__base(x), a.w = fusedk__base(w), a.bias = fusedk__base(bias), a.res = fusedk__base(residual);
  a.out = fusedk__base(out);
  fusedk__conv_strides(x, a.xs), fusedk__conv_strides(out, a.os);
  if (residual) fusedk__conv_strides(residual, a.rs);
  a.ws[0] = fusedk__stride(w, 0), a.ws[1] = v ? fusedk__stride(w, 1) : 0;
  a.ws[2] = fusedk__stride(w, 1 + v), a.ws[3] = fusedk__stride(w, 2 + v);
  if (a.N == 0 || a.To == 0 || a.Ho == 0 || a.Wo == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s.c.dev.device_type)) return fusedk__cuda_conv(&a, s.c.op, s.c.dev.device_id, stream);
  return fusedk__conv_cpu(&a) ? fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: cannot allocate the reference's buffers",
                                             s.c.op) : FUSEDK_OK;
}

/* fold_batchnorm's scale of channel co, in double */
static double fusedk__fold_scale(const fusedk__fold_args *a, int64_t co) {
  const double g = a->gamma ? fusedk__load(a->gamma, co, a->scalar) : 1.0;
  return g / sqrt(fusedk__load(a->var, co, a->scalar) + (double)a->eps);
}

static void fusedk__fold_cpu(const fusedk__fold_args *a) {
  const int s = a->scalar;
  const int64_t es = (int64_t)fusedk__scalar_size(s);
  for (int64_t co = 0; co < a->Co; ++co) {
    const double k = fusedk__fold_scale(a, co), b = a->bias ? fusedk__load(a->bias, co, s) : 0.0;
    if (a->R) { /* an empty w may have no data to offset */
      const char *wr = (const char *)a->w + es * co * a->ws;
      char *wo = (char *)a->w_out + es * co * a->wos;
      for (int64_t r = 0; r < a->R; ++r) fusedk__store(wo, r, fusedk__load(wr, r, s) * k, s);
    }
    fusedk__store(a->b_out, co, (b - fusedk__load(a->mean, co, s)) * k + (a->beta ? fusedk__load(a->beta, co, s) : 0.0), s);
  }
}

/* w [Co, ...] as Co rows of R compact elements: the row stride, or a layout failure */
static fusedk_status fusedk__fold_rows(const fusedk__check *c, const fusedk_tensor *t, const char *name, int64_t *R,
                                       int64_t *rs) {
  int64_t n = 1;
  for (int i = t->ndim - 1; i >= 1; n *= t->shape[i--])
    if (t->shape[i] > 1 && fusedk__stride(t, i) != n)
      return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has stride %lld in dim %d, expected %lld: the dims after the "
                          "first compact (a weight as its module holds it)", c->op, name,
                          (long long)fusedk__stride(t, i), i, (long long)n);
  *R = n, *rs = fusedk__stride(t, 0);
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_fold_batchnorm(const fusedk_tensor *w_out, const fusedk_tensor *b_out,
                                               const fusedk_tensor *w, const fusedk_tensor *bias,
                                               const fusedk_tensor *gamma, const fusedk_tensor *beta,
                                               const fusedk_tensor *mean, const fusedk_tensor *var, float eps,
                                               struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {w_out, b_out, w, bias, gamma, beta, mean, var};
  const char *names[] = {"w_out", "b_out", "w", "bias", "gamma", "beta", "mean", "var"};
  fusedk__rowset s;
  fusedk__fold_args a;
  memset(&a, 0, sizeof a);
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_FOLD_BATCHNORM), t, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  a.Co = w->shape[0];
  for (int k = 3; k < 9; ++k) { /* the inputs first: b_out was allocated like mean */
    const int i = k < 8 ? k : 1;
    if (t[i] && (st = fusedk__check_shape(&s.c, t[i], names[i], 1, &a.Co, "[Co] (the first dim of w)"))) return st;
  }
  int64_t R_out;
  if ((st = fusedk__fold_rows(&s.c, w, "w", &a.R, &a.ws)) || (st = fusedk__fold_rows(&s.c, w_out, "w_out", &R_out, &a.wos)))
    return st;
  const int same = fusedk__same_view(w_out, w); /* in place, else apart from every input */
  for (int i = 2; i < 8; ++i)
    if ((!(same && i == 2) && (st = fusedk__check_disjoint(&s.c, w_out, "w_out", t[i], names[i]))) ||
        (st = fusedk__check_disjoint(&s.c, b_out, "b_out", t[i], names[i])))
      return st;
  if ((st = fusedk__check_disjoint(&s.c, b_out, "b_out", w_out, "w_out"))) return st;
  a.scalar = s.c.scalar, a.eps = eps;
  a.w = fusedk__base(w), a.w_out = fusedk__base(w_out), a.b_out = fusedk__base(b_out), a.bias = fusedk__base(bias);
  a.gamma = fusedk__base(gamma), a.beta = fusedk__base(beta), a.mean = fusedk__base(mean), a.var = fusedk__base(var);
  if (a.Co == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s.c.dev.device_type)) return fusedk__cuda_fold_batchnorm(&a, s.c.op, s.c.dev.device_id, stream);
  fusedk__fold_cpu(&a);
  return FUSEDK_OK;
}

/* group_norm's and channel_rmsnorm's shared checks (t: y, x, weight, bias, scale, shift): act a
   fusedk_activation; scale and shift [N, C] of x (their sample strides into ss); y x itself or
   apart from every input */
static fusedk_status fusedk__cnorm_checks(const fusedk__check *c, const fusedk_tensor *const *t, int act,
                                          int64_t *ss) {
  static const char *names[] = {"y", "x", "weight", "bias", "scale", "shift"};
  const fusedk_tensor *x = t[1];
  fusedk_status st;
  char shp[160];
  if (act < 0 || act > FUSEDK_ACT_NONE)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: act is %d, expected a fusedk_activation (0..%d)", c->op,
                        act, FUSEDK_ACT_NONE);
  for (int k = 4; k < 6; ++k)
    if (t[k]) {
      if (x->ndim < 2)
        return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s is given and x has shape %s, expected [N, ..., C]: scale and "
                            "shift are per sample (x's first dim)", c->op, names[k],
                            fusedk__shape_str(x, shp, sizeof shp));
      const int64_t nc[2] = {x->shape[0], x->shape[x->ndim - 1]};
      if ((st = fusedk__check_shape(c, t[k], names[k], 2, nc, "[N, C] of x"))) return st;
      ss[k - 4] = fusedk__stride(t[k], 0);
    }
  for (int i = 1; i < 6; ++i)
    if (!(i == 1 && fusedk__same_view(t[0], x)) && (st = fusedk__check_disjoint(c, t[0], "y", t[i], names[i])))
      return st;
  return FUSEDK_OK;
}

/* the norms' output at channel c of a normalized v: weight, bias, the sample's scale and shift rows
   (or NULL), act; in double */
static double fusedk__cnorm_out(double v, int64_t c, const void *w, const void *b, const char *sc, const char *sh,
                                int act, int s) {
  if (w) v *= fusedk__load(w, c, s);
  if (b) v += fusedk__load(b, c, s);
  if (sc) v *= 1.0 + fusedk__load(sc, c, s);
  if (sh) v += fusedk__load(sh, c, s);
  return act == FUSEDK_ACT_NONE ? v : fusedk__act_f64(v, act);
}

/* group_norm: per (sample, group) the mean, then the variance about it, in double; one rounding */
static void fusedk__gn_cpu(const fusedk__gn_args *a) {
  const int s = a->scalar;
  const int64_t es = (int64_t)fusedk__scalar_size(s), cg = a->C / a->groups;
  for (int64_t n = 0; n < a->N; ++n)
    for (int64_t g = 0; g < a->groups; ++g) {
      double sum = 0.0, sq = 0.0;
      const char *xn = (const char *)a->x + es * n * a->xs[0];
      char *yn = (char *)a->y + es * n * a->ys[0];
      for (int64_t l = 0; l < a->L; ++l)
        for (int64_t c = g * cg; c < (g + 1) * cg; ++c) sum += fusedk__load(xn + es * l * a->xs[1], c, s);
      const double mean = sum / (double)(a->L * cg);
      for (int64_t l = 0; l < a->L; ++l)
        for (int64_t c = g * cg; c < (g + 1) * cg; ++c) {
          const double d = fusedk__load(xn + es * l * a->xs[1], c, s) - mean;
          sq += d * d;
        }
      const double rstd = 1.0 / sqrt(sq / (double)(a->L * cg) + (double)a->eps);
      const char *sc = a->scale ? (const char *)a->scale + es * n * a->ss[0] : NULL;
      const char *sh = a->shift ? (const char *)a->shift + es * n * a->ss[1] : NULL;
      for (int64_t l = 0; l < a->L; ++l)
        for (int64_t c = g * cg; c < (g + 1) * cg; ++c) {
          const double v = (fusedk__load(xn + es * l * a->xs[1], c, s) - mean) * rstd;
          fusedk__store(yn + es * l * a->ys[1], c, fusedk__cnorm_out(v, c, a->weight, a->bias, sc, sh, a->act, s), s);
        }
    }
}

/* t [N, ..., C] as [N, L, C]: its sample stride and its pixel stride, or a layout failure */
static fusedk_status fusedk__gn_pixels(const fusedk__check *c, const fusedk_tensor *t, const char *name,
                                       int64_t *st) {
  int64_t ps = 0, want = 0; /* the innermost pixel dim's stride, and what the next one out must be */
  int seen = 0;              /* want may be 0: a broadcast pixel dim */
  for (int i = t->ndim - 2; i >= 1; --i) {
    if (t->shape[i] == 1) continue;
    if (seen && fusedk__stride(t, i) != want)
      return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has stride %lld in dim %d, expected %lld: the dims between N "
                          "and C must flatten to one pixel stride", c->op, name, (long long)fusedk__stride(t, i), i,
                          (long long)want);
    if (!seen) ps = fusedk__stride(t, i), seen = 1;
    want = fusedk__stride(t, i) * t->shape[i];
  }
  st[0] = fusedk__stride(t, 0), st[1] = ps;
  return FUSEDK_OK;
}

FUSEDK_DEF fusedk_status fusedk_group_norm(const fusedk_tensor *y, const fusedk_tensor *x, const fusedk_tensor *weight,
                                           const fusedk_tensor *bias, const fusedk_tensor *scale,
                                           const fusedk_tensor *shift, int32_t groups, float eps,
                                           fusedk_activation act, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x, weight, bias, scale, shift};
  fusedk__rowset s;
  fusedk__gn_args a;
  memset(&a, 0, sizeof a);
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_GROUP_NORM), t, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  char shp[160];
  if (x->ndim < 2)
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: x has shape %s, expected [N, ..., C] (channels last)", s.c.op,
                        fusedk__shape_str(x, shp, sizeof shp));
  a.N = x->shape[0], a.C = x->shape[x->ndim - 1], a.L = 1;
  for (int i = 1; i < x->ndim - 1; ++i) a.L *= x->shape[i];
  if (groups < 1 || a.C % groups)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: groups is %d, expected a divisor of C = %lld (x's last dim)",
                        s.c.op, (int)groups, (long long)a.C);
  if ((st = fusedk__cnorm_checks(&s.c, t, (int)act, a.ss)) || (st = fusedk__gn_pixels(&s.c, x, "x", a.xs)) ||
      (st = fusedk__gn_pixels(&s.c, y, "y", a.ys)))
    return st;
  a.scalar = s.c.scalar, a.act = (int32_t)act, a.groups = groups, a.eps = eps;
  a.x = fusedk__base(x), a.y = fusedk__base(y), a.weight = fusedk__base(weight), a.bias = fusedk__base(bias);
  a.scale = fusedk__base(scale), a.shift = fusedk__base(shift);
  if (a.N == 0 || a.L == 0 || a.C == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s.c.dev.device_type)) return fusedk__cuda_group_norm(&a, s.c.op, s.c.dev.device_id, stream);
  fusedk__gn_cpu(&a);
  return FUSEDK_OK;
}

/* channel_rmsnorm: a row's mean square in double, one rounding */
static void fusedk__crms_cpu(const fusedk__crms_args *a) {
  const int s = a->scalar;
  const int64_t es = (int64_t)fusedk__scalar_size(s);
  for (int64_t b = 0; b < a->B; ++b)
    for (int64_t l = 0; l < a->L; ++l) {
      const char *x = (const char *)a->x.p + es * (b * a->x.sb + l * a->x.sl);
      char *y = (char *)a->y.p + es * (b * a->y.sb + l * a->y.sl);
      const int64_t n = (b * a->L + l) / a->P;
      const char *sc = a->scale ? (const char *)a->scale + es * n * a->ss[0] : NULL;
      const char *sh = a->shift ? (const char *)a->shift + es * n * a->ss[1] : NULL;
      double ms = 0.0;
      for (int64_t d = 0; d < a->D; ++d) ms += fusedk__load(x, d, s) * fusedk__load(x, d, s);
      ms /= (double)a->D;
      const double r = a->clamp ? 1.0 / fmax(sqrt(ms), (double)a->eps) : 1.0 / sqrt(ms + (double)a->eps);
      for (int64_t d = 0; d < a->D; ++d)
        fusedk__store(y, d, fusedk__cnorm_out(fusedk__load(x, d, s) * r, d, a->weight, a->bias, sc, sh, a->act, s), s);
    }
}

FUSEDK_DEF fusedk_status fusedk_channel_rmsnorm(const fusedk_tensor *y, const fusedk_tensor *x, const fusedk_tensor *weight,
                                                const fusedk_tensor *bias, const fusedk_tensor *scale,
                                                const fusedk_tensor *shift, float eps, int32_t clamp,
                                                fusedk_activation act, struct CUstream_st *stream) {
  const fusedk_tensor *t[] = {y, x, weight, bias, scale, shift};
  fusedk__rowset s;
  fusedk_status st = fusedk__validate(fusedk__op(FUSEDK_OP_CHANNEL_RMSNORM), t, &s);
  if (st || (st = fusedk__check_eps(&s.c, eps))) return st;
  if (clamp != 0 && clamp != 1)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: clamp is %d, expected 0 (rsqrt(mean + eps)) or 1 (1 / "
                        "max(rms, eps))", s.c.op, (int)clamp);
  fusedk__crms_args a;
  memset(&a, 0, sizeof a);
  if ((st = fusedk__cnorm_checks(&s.c, t, (int)act, a.ss))) return st;
  a.P = 1; /* the rows a sample: x's dims between the first and C */
  for (int i = 1; i < x->ndim - 1; ++i) a.P *= x->shape[i];
  a.scalar = s.c.scalar, a.act = (int32_t)act, a.clamp = clamp, a.eps = eps;
  a.B = s.B, a.L = s.L, a.D = s.D, a.x = s.r[1], a.y = s.r[0];
  a.weight = fusedk__base(weight), a.bias = fusedk__base(bias), a.scale = fusedk__base(scale), a.shift = fusedk__base(shift);
  for (int i = 0; i < x->ndim - 1; ++i)
    if (x->shape[i] == 0) return FUSEDK_OK;
  if (fusedk__is_gpu(s.c.dev.device_type)) return fusedk__cuda_channel_rmsnorm(&a, s.c.op, s.c.dev.device_id, stream);
  fusedk__crms_cpu(&a);
  return FUSEDK_OK;
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
  for (int i = 0; i < FUSEDK_OP_COUNT && k < sizeof tmp; ++i) {
    /* its reference input's dtypes (the table builders' float32 alone), or its out_dtype's */
    const fusedk_op *o = fusedk__op(i);
    const int all = o->tensors[fusedk__ref(o)].scalar < 0 || fusedk__out_dtype_attr(o) >= 0;
    k += (size_t)snprintf(tmp + k, sizeof tmp - k, "%s\"%s\": [%s]", i ? ", " : ", \"ops\": {", o->name,
                          i == FUSEDK_OP_LINEAR_FP8 ? "\"float16\", \"bfloat16\""
                          : all                     ? "\"float32\", \"float16\", \"bfloat16\""
                                                    : "\"float32\"");
  }
  if (k < sizeof tmp) k += (size_t)snprintf(tmp + k, sizeof tmp - k, "}}");
  if (buf && size) snprintf(buf, size, "%s", tmp);
  return k;
}

#ifdef __cplusplus
}
#endif
#endif /* FUSEDK_IMPLEMENTATION */
