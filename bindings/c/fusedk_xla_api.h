/* fusedk_xla_api.h - the part of XLA's FFI C API (xla/ffi/api/c_api.h) that fusedk_xla.c uses.

   Declared here, not included from jaxlib: a user's `pip install .` builds libfusedk in an
   isolated environment without jax, and the handlers must build anyway.

   LAYOUT-IDENTICAL to c_api.h of XLA FFI API version FXLA_API_MAJOR.FXLA_API_MINOR (jaxlib
   0.10): every name is XLA's with the prefix XLA_FFI_ replaced by FXLA_; every struct declared
   here has XLA's fields, of the same types, in the same order; every enum value is XLA's. Enums
   list only the values fusedk uses. Functions of XLA_FFI_Api that fusedk never calls are typed
   FXLA_Unused (a function pointer all the same). tests/test_xla_layout.c static-asserts all of
   it against jaxlib's real header.

   Compatibility rules of the C API (c_api.h): a minor version only appends struct fields, and
   every struct carries its size, so a reader checks struct_size before touching a later field. */
#ifndef FUSEDK_XLA_API_H
#define FUSEDK_XLA_API_H

#include <stddef.h>
#include <stdint.h>

#define FXLA_API_MAJOR 0
#define FXLA_API_MINOR 3

/* bytes up to and including last_field: XLA's XLA_FFI_STRUCT_SIZE, which its STRUCT_SIZE
   constants use (often short of sizeof: trailing fields added later are not counted) */
#define FXLA_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type *)0)->last_field))

typedef struct FXLA_Api FXLA_Api;

/* --- extensions -------------------------------------------------------------------------- */
typedef enum { FXLA_Extension_Metadata = 1 } FXLA_Extension_Type;

typedef struct FXLA_Extension_Base {
  size_t struct_size;
  FXLA_Extension_Type type;
  struct FXLA_Extension_Base *next;
} FXLA_Extension_Base;

typedef struct FXLA_Api_Version {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  int major_version;
  int minor_version;
} FXLA_Api_Version;
#define FXLA_Api_Version_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Api_Version, minor_version)

/* --- errors -------------------------------------------------------------------------------- */
typedef struct FXLA_Error FXLA_Error; /* opaque; a handler returns one, XLA destroys it */

typedef enum {
  FXLA_Error_Code_OK = 0,
  FXLA_Error_Code_INVALID_ARGUMENT = 3,
  FXLA_Error_Code_RESOURCE_EXHAUSTED = 8,
  FXLA_Error_Code_UNIMPLEMENTED = 12,
  FXLA_Error_Code_INTERNAL = 13,
  FXLA_Error_Code_UNAUTHENTICATED = 16 /* the last value: the enum spans XLA's range */
} FXLA_Error_Code;

typedef struct FXLA_Error_Create_Args {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  const char *message;
  FXLA_Error_Code errc;
} FXLA_Error_Create_Args;
#define FXLA_Error_Create_Args_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Error_Create_Args, errc)
typedef FXLA_Error *FXLA_Error_Create(FXLA_Error_Create_Args *args);

typedef struct FXLA_Error_Destroy_Args {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  FXLA_Error *error;
} FXLA_Error_Destroy_Args;
#define FXLA_Error_Destroy_Args_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Error_Destroy_Args, error)
typedef void FXLA_Error_Destroy(FXLA_Error_Destroy_Args *args);

/* --- data types (xla::PrimitiveType) ------------------------------------------------------- */
typedef enum {
  FXLA_DataType_INVALID = 0,
  FXLA_DataType_PRED = 1,
  FXLA_DataType_S8 = 2,
  FXLA_DataType_S16 = 3,
  FXLA_DataType_S32 = 4,
  FXLA_DataType_S64 = 5,
  FXLA_DataType_U8 = 6,
  FXLA_DataType_U16 = 7,
  FXLA_DataType_U32 = 8,
  FXLA_DataType_U64 = 9,
  FXLA_DataType_F16 = 10,
  FXLA_DataType_F32 = 11,
  FXLA_DataType_F64 = 12,
  FXLA_DataType_C64 = 15,
  FXLA_DataType_BF16 = 16,
  FXLA_DataType_C128 = 18,
  FXLA_DataType_F8E4M3FN = 20,
  FXLA_DataType_F8E8M0FNU = 33 /* the largest value: the enum spans XLA's range */
} FXLA_DataType;

/* --- arguments, results, attributes -------------------------------------------------------- */
typedef struct FXLA_Buffer {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  FXLA_DataType dtype;
  void *data;
  int64_t rank;
  int64_t *dims; /* rank sizes, row-major (the default layout ffi_call asks for) */
} FXLA_Buffer;
#define FXLA_Buffer_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Buffer, dims)

typedef enum { FXLA_ArgType_BUFFER = 1 } FXLA_ArgType;
typedef enum { FXLA_RetType_BUFFER = 1 } FXLA_RetType;
typedef enum {
  FXLA_AttrType_ARRAY = 1,
  FXLA_AttrType_DICTIONARY = 2,
  FXLA_AttrType_SCALAR = 3,
  FXLA_AttrType_STRING = 4
} FXLA_AttrType;

typedef struct FXLA_ExecutionContext FXLA_ExecutionContext; /* opaque */

typedef struct FXLA_ByteSpan { /* attribute names: not NUL-terminated */
  const char *ptr;
  size_t len;
} FXLA_ByteSpan;

typedef struct FXLA_Scalar {
  FXLA_DataType dtype;
  void *value;
} FXLA_Scalar;

typedef struct FXLA_TypeId {
  int64_t type_id;
} FXLA_TypeId;

typedef struct FXLA_Future FXLA_Future; /* opaque */

/* --- the call frame ------------------------------------------------------------------------ */
typedef enum {
  FXLA_ExecutionStage_INSTANTIATE = 0,
  FXLA_ExecutionStage_PREPARE = 1,
  FXLA_ExecutionStage_INITIALIZE = 2,
  FXLA_ExecutionStage_EXECUTE = 3
} FXLA_ExecutionStage;

typedef struct FXLA_Args {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  int64_t size;
  FXLA_ArgType *types;
  void **args; /* FXLA_Buffer * where types[i] == BUFFER */
} FXLA_Args;
#define FXLA_Args_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Args, args)

typedef struct FXLA_Rets {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  int64_t size;
  FXLA_RetType *types;
  void **rets;
} FXLA_Rets;
#define FXLA_Rets_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Rets, rets)

typedef struct FXLA_Attrs { /* sorted by name */
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  int64_t size;
  FXLA_AttrType *types;
  FXLA_ByteSpan **names;
  void **attrs; /* FXLA_Scalar * where types[i] == SCALAR */
} FXLA_Attrs;
#define FXLA_Attrs_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Attrs, attrs)

typedef struct FXLA_CallFrame {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  const FXLA_Api *api;
  FXLA_ExecutionContext *ctx;
  FXLA_ExecutionStage stage;
  FXLA_Args args;
  FXLA_Rets rets;
  FXLA_Attrs attrs;
  FXLA_Future *future; /* out; not counted in XLA's STRUCT_SIZE */
} FXLA_CallFrame;
#define FXLA_CallFrame_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_CallFrame, attrs)

typedef FXLA_Error *FXLA_Handler(FXLA_CallFrame *call_frame);

enum FXLA_Handler_TraitsBits { FXLA_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE = 1u << 0 };
typedef uint32_t FXLA_Handler_Traits;

/* --- execution context queries ------------------------------------------------------------- */
typedef struct FXLA_Stream_Get_Args {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  FXLA_ExecutionContext *ctx;
  void *stream; /* out: the CUstream (= cudaStream_t) on CUDA */
} FXLA_Stream_Get_Args;
#define FXLA_Stream_Get_Args_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Stream_Get_Args, stream)
typedef FXLA_Error *FXLA_Stream_Get(FXLA_Stream_Get_Args *args);

typedef struct FXLA_DeviceOrdinal_Get_Args {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  FXLA_ExecutionContext *ctx;
  int32_t device_ordinal; /* out */
} FXLA_DeviceOrdinal_Get_Args;
#define FXLA_DeviceOrdinal_Get_Args_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_DeviceOrdinal_Get_Args, device_ordinal)
typedef FXLA_Error *FXLA_DeviceOrdinal_Get(FXLA_DeviceOrdinal_Get_Args *args);

/* --- the metadata query: XLA asks a handler for its API version and traits ----------------- */
typedef struct FXLA_Metadata {
  size_t struct_size;
  FXLA_Api_Version api_version;
  FXLA_Handler_Traits traits;
  FXLA_TypeId state_type_id; /* not counted in XLA's STRUCT_SIZE */
} FXLA_Metadata;
#define FXLA_Metadata_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Metadata, traits)

typedef struct FXLA_Metadata_Extension {
  FXLA_Extension_Base extension_base;
  FXLA_Metadata *metadata;
} FXLA_Metadata_Extension;
#define FXLA_Metadata_Extension_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Metadata_Extension, metadata)

/* --- the API table ------------------------------------------------------------------------- */
typedef void FXLA_Unused(void);

struct FXLA_Api {
  size_t struct_size;
  FXLA_Extension_Base *extension_start;
  FXLA_Api_Version api_version; /* of the XLA runtime calling the handler */
  const void *internal_api;     /* const XLA_FFI_InternalApi * */
  FXLA_Error_Create *FXLA_Error_Create;
  FXLA_Unused *FXLA_Error_GetMessage;
  FXLA_Error_Destroy *FXLA_Error_Destroy;
  FXLA_Unused *FXLA_Handler_Register;
  FXLA_Stream_Get *FXLA_Stream_Get;
  FXLA_Unused *FXLA_Type_Register;
  FXLA_Unused *FXLA_ExecutionContext_Get;
  FXLA_Unused *FXLA_State_Set;
  FXLA_Unused *FXLA_State_Get;
  FXLA_Unused *FXLA_DeviceMemory_Allocate;
  FXLA_Unused *FXLA_DeviceMemory_Free;
  FXLA_Unused *FXLA_ThreadPool_Schedule;
  FXLA_Unused *FXLA_ThreadPool_NumThreads;
  FXLA_Unused *FXLA_Future_Create;
  FXLA_Unused *FXLA_Future_SetAvailable;
  FXLA_Unused *FXLA_Future_SetError;
  FXLA_Unused *FXLA_RunId_Get;
  FXLA_DeviceOrdinal_Get *FXLA_DeviceOrdinal_Get;
};
#define FXLA_Api_STRUCT_SIZE FXLA_STRUCT_SIZE(FXLA_Api, FXLA_DeviceOrdinal_Get)

#endif /* FUSEDK_XLA_API_H */
