/* bindings/c/fusedk_xla_api.h is layout-identical to XLA's FFI C API: checked against jaxlib's
   real xla/ffi/api/c_api.h at compile time. Every name there is XLA's with XLA_FFI_ replaced by
   FXLA_; both headers live in one translation unit because of that prefix. */
#include <stddef.h>
#include <stdio.h>

#include "xla/ffi/api/c_api.h"
#include "bindings/c/fusedk_xla_api.h"

/* Whole-struct sizes are equal against the header of our own API version; a later minor may
   have appended fields (never moved one), so against a newer jaxlib ours may only be smaller. */
#if XLA_FFI_API_MINOR == FXLA_API_MINOR
#define FITS ==
#else
#define FITS <=
#endif
/* same size; same offset and size of a field */
#define SAME(s) _Static_assert(sizeof(FXLA_##s) FITS sizeof(XLA_FFI_##s), #s " size")
#define AT(s, f)                                                                                   \
  _Static_assert(offsetof(FXLA_##s, f) == offsetof(XLA_FFI_##s, f) &&                              \
                 sizeof(((FXLA_##s *)0)->f) == sizeof(((XLA_FFI_##s *)0)->f), #s "." #f)
#define FN(f)                                                                                      \
  _Static_assert(offsetof(FXLA_Api, FXLA_##f) == offsetof(XLA_FFI_Api, XLA_FFI_##f) &&             \
                 sizeof(((FXLA_Api *)0)->FXLA_##f) == sizeof(((XLA_FFI_Api *)0)->XLA_FFI_##f), "Api." #f)
#define VAL(v) _Static_assert((long long)FXLA_##v == (long long)XLA_FFI_##v, #v)
/* our STRUCT_SIZE constants are XLA's (the sizes XLA puts in struct_size and checks it against) */
#define SIZE(s) _Static_assert(FXLA_##s##_STRUCT_SIZE FITS XLA_FFI_##s##_STRUCT_SIZE, #s "_STRUCT_SIZE")

/* API 0.4 (jaxlib 0.11) renamed, without moving anything: Extension_Base -> InternalExtension,
   Error_GetMessage -> Error_GetDetails (its args gained a field at the end), ExecutionContext_Get
   -> InvokeContext_Get; it appended a field to Handler_Bundle and the Api. Compare with the names
   of whichever version jaxlib has. */
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR >= 4
typedef XLA_FFI_InternalExtension XLA_FFI_Extension_Base;
typedef XLA_FFI_InternalExtension_Type XLA_FFI_Extension_Type;
#define THEIR_GET_MESSAGE Error_GetDetails
#define THEIR_CONTEXT_GET InvokeContext_Get
#else
#define THEIR_GET_MESSAGE Error_GetMessage
#define THEIR_CONTEXT_GET ExecutionContext_Get
#endif
#define FN_AS(f, g) FN_AS_(f, g) /* expands g first */
#define FN_AS_(f, g)                                                                               \
  _Static_assert(offsetof(FXLA_Api, FXLA_##f) == offsetof(XLA_FFI_Api, XLA_FFI_##g) &&             \
                 sizeof(((FXLA_Api *)0)->FXLA_##f) == sizeof(((XLA_FFI_Api *)0)->XLA_FFI_##g), "Api." #f)

_Static_assert(FXLA_API_MAJOR == XLA_FFI_API_MAJOR, "XLA FFI API major version");
/* our minor may lag jaxlib's (XLA accepts older handlers); never lead it */
_Static_assert(FXLA_API_MINOR <= XLA_FFI_API_MINOR, "XLA FFI API minor version");

SAME(Extension_Base); AT(Extension_Base, struct_size); AT(Extension_Base, type); AT(Extension_Base, next);
SAME(Api_Version); AT(Api_Version, struct_size); AT(Api_Version, extension_start);
AT(Api_Version, major_version); AT(Api_Version, minor_version); SIZE(Api_Version);
SAME(Error_Create_Args); AT(Error_Create_Args, struct_size); AT(Error_Create_Args, extension_start);
AT(Error_Create_Args, message); AT(Error_Create_Args, errc); SIZE(Error_Create_Args);
SAME(Error_Destroy_Args); AT(Error_Destroy_Args, struct_size); AT(Error_Destroy_Args, extension_start);
AT(Error_Destroy_Args, error); SIZE(Error_Destroy_Args);
SAME(Buffer); AT(Buffer, struct_size); AT(Buffer, extension_start); AT(Buffer, dtype); AT(Buffer, data);
AT(Buffer, rank); AT(Buffer, dims); SIZE(Buffer);
SAME(ByteSpan); AT(ByteSpan, ptr); AT(ByteSpan, len);
SAME(Scalar); AT(Scalar, dtype); AT(Scalar, value);
SAME(TypeId); AT(TypeId, type_id);
SAME(Args); AT(Args, struct_size); AT(Args, extension_start); AT(Args, size); AT(Args, types); AT(Args, args);
SIZE(Args);
SAME(Rets); AT(Rets, struct_size); AT(Rets, extension_start); AT(Rets, size); AT(Rets, types); AT(Rets, rets);
SIZE(Rets);
SAME(Attrs); AT(Attrs, struct_size); AT(Attrs, extension_start); AT(Attrs, size); AT(Attrs, types);
AT(Attrs, names); AT(Attrs, attrs); SIZE(Attrs);
SAME(CallFrame); AT(CallFrame, struct_size); AT(CallFrame, extension_start); AT(CallFrame, api); AT(CallFrame, ctx);
AT(CallFrame, stage); AT(CallFrame, args); AT(CallFrame, rets); AT(CallFrame, attrs); AT(CallFrame, future);
SIZE(CallFrame);
SAME(Stream_Get_Args); AT(Stream_Get_Args, struct_size); AT(Stream_Get_Args, extension_start);
AT(Stream_Get_Args, ctx); AT(Stream_Get_Args, stream); SIZE(Stream_Get_Args);
SAME(DeviceOrdinal_Get_Args); AT(DeviceOrdinal_Get_Args, struct_size); AT(DeviceOrdinal_Get_Args, extension_start);
AT(DeviceOrdinal_Get_Args, ctx); AT(DeviceOrdinal_Get_Args, device_ordinal); SIZE(DeviceOrdinal_Get_Args);
SAME(Metadata); AT(Metadata, struct_size); AT(Metadata, api_version); AT(Metadata, traits);
AT(Metadata, state_type_id); SIZE(Metadata);
SAME(Metadata_Extension); AT(Metadata_Extension, extension_base); AT(Metadata_Extension, metadata);
SIZE(Metadata_Extension);
_Static_assert(sizeof(FXLA_Handler_Traits) == sizeof(XLA_FFI_Handler_Traits), "Handler_Traits");

SAME(Api); AT(Api, struct_size); AT(Api, extension_start); AT(Api, api_version); AT(Api, internal_api); SIZE(Api);
FN(Error_Create); FN_AS(Error_GetMessage, THEIR_GET_MESSAGE); FN(Error_Destroy); FN(Handler_Register);
FN(Stream_Get); FN(Type_Register); FN_AS(ExecutionContext_Get, THEIR_CONTEXT_GET); FN(State_Set); FN(State_Get); FN(DeviceMemory_Allocate);
FN(DeviceMemory_Free); FN(ThreadPool_Schedule); FN(ThreadPool_NumThreads); FN(Future_Create);
FN(Future_SetAvailable); FN(Future_SetError); FN(RunId_Get); FN(DeviceOrdinal_Get);

/* enums: every value declared, and each enum the size of XLA's */
VAL(Extension_Metadata);
_Static_assert(sizeof(FXLA_Extension_Type) == sizeof(XLA_FFI_Extension_Type), "Extension_Type");
VAL(Error_Code_OK); VAL(Error_Code_INVALID_ARGUMENT); VAL(Error_Code_RESOURCE_EXHAUSTED);
VAL(Error_Code_UNIMPLEMENTED); VAL(Error_Code_INTERNAL); VAL(Error_Code_UNAUTHENTICATED);
_Static_assert(sizeof(FXLA_Error_Code) == sizeof(XLA_FFI_Error_Code), "Error_Code");
VAL(DataType_INVALID); VAL(DataType_PRED); VAL(DataType_S8); VAL(DataType_S16); VAL(DataType_S32);
VAL(DataType_S64); VAL(DataType_U8); VAL(DataType_U16); VAL(DataType_U32); VAL(DataType_U64);
VAL(DataType_F16); VAL(DataType_F32); VAL(DataType_F64); VAL(DataType_C64); VAL(DataType_BF16);
VAL(DataType_C128); VAL(DataType_F8E8M0FNU);
_Static_assert(sizeof(FXLA_DataType) == sizeof(XLA_FFI_DataType), "DataType");
VAL(ArgType_BUFFER); VAL(RetType_BUFFER);
_Static_assert(sizeof(FXLA_ArgType) == sizeof(XLA_FFI_ArgType) && sizeof(FXLA_RetType) == sizeof(XLA_FFI_RetType),
               "ArgType, RetType");
VAL(AttrType_ARRAY); VAL(AttrType_DICTIONARY); VAL(AttrType_SCALAR); VAL(AttrType_STRING);
_Static_assert(sizeof(FXLA_AttrType) == sizeof(XLA_FFI_AttrType), "AttrType");
VAL(ExecutionStage_INSTANTIATE); VAL(ExecutionStage_PREPARE); VAL(ExecutionStage_INITIALIZE);
VAL(ExecutionStage_EXECUTE);
_Static_assert(sizeof(FXLA_ExecutionStage) == sizeof(XLA_FFI_ExecutionStage), "ExecutionStage");
_Static_assert((long long)FXLA_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE ==
                   (long long)XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE,
               "traits");

int main(void) {
  printf("ok: fusedk_xla_api.h == xla/ffi/api/c_api.h (XLA FFI API %d.%d; jaxlib's %d.%d)\n", FXLA_API_MAJOR,
         FXLA_API_MINOR, XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  return 0;
}
