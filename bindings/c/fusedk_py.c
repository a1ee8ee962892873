/* fusedk_py.c - the fast call path of the Python bindings, in C, without Python.h.

   A Python call on framework tensors costs what the framework's own op costs only if nothing in
   it goes through Python objects per tensor: no __dlpack__ capsules, no output buffers allocated
   outside the framework's allocator, no stream objects, no foreign-function layer. So:
   - fusedk_py_fast makes the builtin every op function calls (fusedk._core.call): a
     METH_FASTCALL function, called like any C builtin (no ctypes or cffi argument conversion),
     that picks a route by the type of the op's first input and runs the whole call in C;
   - a route is DLPack's C exchange API (dlpack.h >= 1.2: a type's __dlpack_c_exchange_api__,
     torch >= 2.11): a DLTensor view of each argument, outputs from the framework's allocator, its
     current stream, the result handed back as its tensor;
   - or, for CuPy (no exchange API), the arrays' own attributes (.data.ptr, .shape, .strides,
     .dtype), outputs and the current stream from CuPy's own C entry points where their
     signatures are the expected ones (CuPy's Cython C API), else from cupy.ndarray and
     cupy.cuda.get_current_stream;
   - types without a route (NumPy, JAX, other DLPack producers), stream objects and failures go
     back to Python (the slow and failure callables given to fusedk_py_fast).
   The CPython entry points used here are handed over once by the bindings (ctypes.pythonapi).
   Nothing here needs Python's headers or links against libpython. GIL held throughout (the
   ctypes entry points go through ctypes.PyDLL; cffi would release it).

   Also here: fusedk_op_call_packed, the path of arrays packed by Python (NumPy, other
   producers): pointer, shape and byte strides of each array in one buffer.

   Compiled into libfusedk by meson; not part of the two-file drop-in. */
#define FUSEDK__INTERNAL
#include "fusedk.h"

#include <stdio.h>
#include <string.h>

#if defined(_MSC_VER)
#define FUSEDK__PY_TLS __declspec(thread)
#else
#define FUSEDK__PY_TLS __thread
#endif

/* DLPackExchangeAPI (dlpack.h 1.2/1.3), layout-identical: the versioned header, then five
   functions in this order. */
typedef struct fusedk_xapi {
  uint32_t major, minor;
  void *prev_api;
  int (*allocator)(fusedk_tensor *prototype, fusedk_dlmanaged_versioned **out, void *error_ctx,
                   void (*set_error)(void *error_ctx, const char *kind, const char *message));
  int (*managed_from_py)(void *py_object, fusedk_dlmanaged_versioned **out);
  int (*managed_to_py)(fusedk_dlmanaged_versioned *tensor, void **out_py_object);
  int (*view_from_py)(void *py_object, fusedk_tensor *out); /* may be NULL */
  int (*current_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} fusedk_xapi;

/* The CPython entry points this file uses, from the bindings (ctypes.pythonapi), in this order. */
static struct {
  void *none;
  void (*incref)(void *);
  void (*decref)(void *);
  void *(*tuple_new)(intptr_t);
  int (*tuple_setitem)(void *, intptr_t, void *); /* steals the item */
  void *(*tuple_getitem)(void *, intptr_t);       /* borrowed */
  intptr_t (*tuple_size)(void *);
  void (*err_clear)(void);
  void *(*getattr)(void *, const char *);         /* PyObject_GetAttrString: a new reference */
  long long (*as_longlong)(void *);
  void *(*dict_getitem)(void *, void *);          /* PyDict_GetItem: borrowed, no error set */
  void *(*call)(void *, void *, void *);          /* PyObject_Call */
  int (*isinstance)(void *, void *);
  void *(*type_of)(void *);                       /* PyObject_Type: a new reference */
  double (*as_double)(void *);                    /* PyFloat_AsDouble */
  void *(*err_occurred)(void);
  void *(*capsule_pointer)(void *, const char *); /* PyCapsule_GetPointer */
  void *(*cfunction_new)(void *, void *, void *); /* PyCFunction_NewEx */
  void *(*long_from)(long long);                  /* PyLong_FromLongLong */
} py;

static FUSEDK__PY_TLS int last; /* the last routed call's status, or -1: left to the generic path */
enum { FUSEDK_PY_AUTOGRAD = -2 }; /* last: autograd records the call, left to the custom operator */

/* fns: Py_None, then the functions of the struct above, in its order. */
FUSEDK_DEF void fusedk_py_init(void *const *fns, int n) {
  if (n * sizeof(void *) == sizeof py) memcpy(&py, fns, sizeof py);
}

/* The status of this thread's last routed call, or -1 where it left the call to the generic
   path: an argument the route cannot view (another framework's array, a list, a scalar); -2
   where autograd records it (the framework's custom operator takes it). */
FUSEDK_DEF int fusedk_py_last(void) { return last; }

/* The failure value: None (a new reference); fusedk_failure_reason() says why. */
static void *failed(int status) {
  last = status;
  py.incref(py.none);
  return py.none;
}

typedef struct { const char *op, *name; } alloc_ctx;

static void alloc_error(void *ctx, const char *kind, const char *message) {
  const alloc_ctx *c = (const alloc_ctx *)ctx;
  const int oom = (kind && strstr(kind, "Memory")) || (message && strstr(message, "out of memory"));
  fusedk__fail(oom ? FUSEDK_ERR_OUT_OF_MEMORY : FUSEDK_ERR_INVALID_ARGUMENT,
               "%s: allocating %s through the framework's allocator failed: %s: %s", c->op, c->name,
               kind ? kind : "error", message ? message : "");
}

static int is_gpu(int32_t t) { return t == FUSEDK_DEVICE_CUDA || t == FUSEDK_DEVICE_CUDA_MANAGED; }


/* Returns the outputs that exist, in registry order (a new reference): the caller's out=
   objects, or the new ones (made[i]: handed to the framework through the exchange API, which
   takes ownership whatever it returns, so made[i] is cleared; else obj[i] already holds a new
   reference when owned[i]). NULL when the result cannot be built: the failure reason is set,
   nothing is leaked, and the caller still owns the made[] tensors left. */
static void *results(const fusedk_op *o, const fusedk_tensor *const *t, void *const *obj,
                     fusedk_dlmanaged_versioned **made, const fusedk_xapi *x, const int *owned, int n_out) {
  void *res = n_out > 1 ? py.tuple_new(n_out) : NULL, *one = NULL;
  int k = 0, ok = n_out <= 1 || res != NULL;
  if (!ok) fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: building the tuple of results failed", o->name);
  for (int i = 0; i < o->n_tensors; ++i) {
    const fusedk_op_tensor *a = &o->tensors[i];
    if (a->kind < FUSEDK_ARG_OUT || !t[i]) continue;
    void *r = obj[i];
    if (made && made[i]) {
      r = NULL;
      if (!ok) continue; /* the caller deletes it */
      const int st = x->managed_to_py(made[i], &r);
      made[i] = NULL; /* stolen, success or not */
      if (st != 0 || !r) { /* written, but it cannot be handed back */
        r = NULL;
        ok = 0;
        fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: handing %s back to the framework failed", o->name, a->name);
        continue;
      }
    } else if (!owned || !owned[i]) { /* the caller's out=: returned as a new reference */
      py.incref(r);
    }
    if (res) py.tuple_setitem(res, k++, r); /* steals r */
    else if (ok) one = r;
    else py.decref(r);
  }
  if (!ok) {
    py.err_clear();
    if (res) py.decref(res);
    if (one) py.decref(one);
    return NULL;
  }
  last = FUSEDK_OK;
  return res ? res : one;
}

/* Runs registry op `op` on `args`, a tuple of the op's tensors in registry order (None = an
   absent input, or an output to allocate), through `x`, the exchange API of the first input's
   type. stream < 0: the framework's current stream of that input's device. Returns a new
   reference: the output, or a tuple of the outputs that exist; None on failure, with the
   failure reason and fusedk_py_last() set. */
static void *exchange_call(const fusedk_xapi *x, int32_t op, void *args, const double *attrs, int64_t stream) {
  const fusedk_op *o = fusedk_op_get(op);
  if (!o || !x || !x->view_from_py) return failed(-1);
  fusedk_tensor view[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *t[FUSEDK_OP_MAX_TENSORS];
  fusedk_dlmanaged_versioned *made[FUSEDK_OP_MAX_TENSORS] = {0};
  void *obj[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *ref = NULL;
  for (int i = 0; i < o->n_tensors; ++i) {
    obj[i] = py.tuple_getitem(args, i);
    if (!obj[i]) { py.err_clear(); return failed(-1); }
    if (obj[i] == py.none) obj[i] = NULL;
    t[i] = NULL;
    if (!obj[i]) continue;
    if (x->view_from_py(obj[i], &view[i]) != 0) { /* not this framework's tensor */
      py.err_clear();
      return failed(-1);
    }
    t[i] = &view[i];
    if (!ref && o->tensors[i].kind <= FUSEDK_ARG_IN_OPT) ref = t[i];
  }
  int n_out = 0;
  int status = FUSEDK_OK; /* or -1: the generic path takes the call */
  for (int i = 0; i < o->n_tensors; ++i) {
    const fusedk_op_tensor *a = &o->tensors[i];
    if (a->kind < FUSEDK_ARG_OUT || !fusedk_op_out_exists(op, i, t, attrs)) continue;
    ++n_out;
    if (t[i]) continue; /* out= given */
    if (!t[a->like]) { /* a required input is missing: the generic path says which */
      status = -1;
      break;
    }
    fusedk_tensor proto = *t[a->like];
    int64_t dims[FUSEDK_MAX_DIMS];
    const int32_t nd = fusedk_op_out_shape(op, i, t, attrs, dims);
    if (nd < 0) { /* the generic path names what is wrong */
      status = -1;
      break;
    }
    proto.ndim = nd, proto.shape = dims, proto.strides = NULL, proto.byte_offset = 0, proto.data = NULL;
    const int32_t sc = fusedk_op_out_scalar(op, i, attrs); /* fixed, or out_dtype's */
    if (sc >= 0) proto.dtype = fusedk_dtype_of((fusedk_scalar)sc);
    alloc_ctx ctx = {o->name, a->name};
    if (x->allocator(&proto, &made[i], &ctx, alloc_error) != 0 || !made[i]) {
      made[i] = NULL;
      py.err_clear();
      status = FUSEDK_ERR_OUT_OF_MEMORY;
      break;
    }
    t[i] = &made[i]->dl_tensor;
  }
  if (status == FUSEDK_OK) {
    void *s = (void *)(intptr_t)stream;
    if (stream < 0) {
      s = NULL;
      if (ref && is_gpu(ref->device.device_type) && x->current_stream(ref->device.device_type, ref->device.device_id, &s)) {
        py.err_clear();
        s = NULL;
      }
    }
    status = fusedk_op_call(op, t, attrs, (struct CUstream_st *)s);
  }
  void *res = status == FUSEDK_OK ? results(o, t, obj, made, x, NULL, n_out) : NULL;
  if (res) return res;
  for (int i = 0; i < o->n_tensors; ++i)
    if (made[i] && made[i]->deleter) made[i]->deleter(made[i]);
  return failed(status == FUSEDK_OK ? FUSEDK_ERR_OUT_OF_MEMORY : status);
}

/* --- routes: how arrays of one Python type reach the library ----------------------------- */

/* CuPy's Cython C API (cupy._core.core and cupy.cuda.stream's __pyx_capi__), taken only when
   the capsule's signature is exactly this one: _ndarray_init is the allocation CuPy's own ufuncs
   make (its memory pool, current device), at a third of cupy.ndarray(shape, dtype)'s cost. shape_t
   is std::vector<Py_ssize_t>: passed as the three pointers every C++ library lays it out as. */
#define FUSEDK__CUPY_INIT_SIG "struct __pyx_obj_4cupy_5_core_4core__ndarray_base *(PyObject *, " \
                              "__pyx_t_4cupy_5_core_7_carray_shape_t const &, PyObject *, PyObject *)"
#define FUSEDK__CUPY_STREAM_SIG "intptr_t (void)"
typedef struct { int64_t *begin, *end, *cap; } fusedk__shape_vec;

enum { DTYPE_CACHE = 4 };
typedef struct route {
  void *type;              /* the arrays' exact type (a strong reference) */
  const fusedk_xapi *x;    /* the exchange API, or NULL: read the attributes */
  void *dtypes;            /* attributes: dict dtype -> code | bits << 8 | lanes << 16 */
  void *(*init)(void *subtype, const fusedk__shape_vec *shape, void *dtype, void *obj); /* or NULL */
  intptr_t (*stream_ptr)(void); /* the current stream, or NULL: get_stream().ptr */
  void *get_stream;
  void *grad_mode;         /* torch.is_grad_enabled, or NULL: no autograd to keep */
  void *dt_obj[DTYPE_CACHE]; /* dtype objects seen (strong references) and their codes: a pointer */
  long long dt_code[DTYPE_CACHE]; /* compare instead of hashing a dtype per array */
} route;
enum { MAX_ROUTES = 16 };
static route routes[MAX_ROUTES];
static int n_routes;

static void *capsule_fn(void *capsule, const char *signature) {
  void *f = capsule && capsule != py.none ? py.capsule_pointer(capsule, signature) : NULL;
  if (!f) py.err_clear(); /* absent, or another signature: the Python-level call instead */
  return f;
}

/* Registers a route for `type` (GIL held): x, the exchange API; or dtypes (a dict, see above),
   CuPy's _ndarray_init and get_current_stream_ptr capsules (None or another signature: not
   used) and get_stream, a callable returning the current stream object (.ptr). grad_mode: a
   callable saying whether autograd records (torch.is_grad_enabled), or None. Returns the
   route's index, or -1 where the table is full (the type then stays on the Python path). */
FUSEDK_DEF int fusedk_py_route(void *type, const fusedk_xapi *x, void *dtypes, void *init, void *stream_ptr,
                               void *get_stream, void *grad_mode) {
  for (int i = 0; i < n_routes; ++i)
    if (routes[i].type == type) return i;
  if (n_routes == MAX_ROUTES) return -1;
  route *r = &routes[n_routes];
  memset(r, 0, sizeof *r);
  r->type = type, r->x = x, r->dtypes = dtypes, r->get_stream = get_stream;
  r->grad_mode = grad_mode != py.none ? grad_mode : NULL;
  r->init = (void *(*)(void *, const fusedk__shape_vec *, void *, void *))capsule_fn(init, FUSEDK__CUPY_INIT_SIG);
  r->stream_ptr = (intptr_t(*)(void))capsule_fn(stream_ptr, FUSEDK__CUPY_STREAM_SIG);
  py.incref(type), py.incref(dtypes), py.incref(get_stream), py.incref(grad_mode); /* for the process */
  return n_routes++;
}

/* 1 where route i reads arrays through CuPy's C entry points (what the bench reports). */
FUSEDK_DEF int fusedk_py_route_native(int i) {
  return i >= 0 && i < n_routes && routes[i].init && routes[i].stream_ptr;
}

static long long attr_ll(void *o, const char *name, int *err) {
  void *v = py.getattr(o, name);
  if (!v) return *err = 1, 0;
  long long r = py.as_longlong(v);
  py.decref(v);
  if (r == -1) *err = 1; /* -1 is an error, or a value no device pointer, ordinal or size has */
  return r;
}

static long long dtype_code(route *r, void *dt) {
  for (int k = 0; k < DTYPE_CACHE && r->dt_obj[k]; ++k)
    if (r->dt_obj[k] == dt) return r->dt_code[k];
  void *code = py.dict_getitem(r->dtypes, dt);
  const long long c = code ? py.as_longlong(code) : -1;
  for (int k = 0; c >= 0 && k < DTYPE_CACHE; ++k)
    if (!r->dt_obj[k]) {
      py.incref(dt);
      r->dt_obj[k] = dt, r->dt_code[k] = c;
      break;
    }
  return c;
}

/* The view of a CuPy-like array: 0, or -1 where the generic path should look at it (it reports
   what is wrong). */
static int attrs_view(route *r, void *obj, fusedk_tensor *v, int64_t *dims) {
  int err = 0; /* each read only while nothing has failed: no CPython call with an error set */
  void *data = py.getattr(obj, "data");
  void *dt = data ? py.getattr(obj, "dtype") : NULL;
  void *shape = dt ? py.getattr(obj, "shape") : NULL;
  void *strides = shape ? py.getattr(obj, "strides") : NULL;
  long long ptr = strides ? attr_ll(data, "ptr", &err) : 0;
  long long dev = strides && !err ? attr_ll(data, "device_id", &err) : 0;
  long long c = strides && !err ? dtype_code(r, dt) : -1;
  intptr_t n = c >= 0 ? py.tuple_size(shape) : -1;
  int ok = data && dt && shape && strides && !err && c >= 0 && n >= 0 && n <= FUSEDK_MAX_DIMS &&
           py.tuple_size(strides) == n;
  const int64_t item = ((c >> 8) & 0xff) / 8 * ((c >> 16) & 0xffff);
  for (intptr_t d = 0; ok && d < n; ++d) {
    dims[d] = py.as_longlong(py.tuple_getitem(shape, d));
    const long long b = dims[d] >= 0 ? py.as_longlong(py.tuple_getitem(strides, d)) : 0;
    ok = dims[d] >= 0 && !py.err_occurred() && item > 0 && b % item == 0;
    dims[n + d] = b / (item > 0 ? item : 1);
  }
  void *refs[4] = {data, dt, shape, strides};
  for (int k = 0; k < 4; ++k)
    if (refs[k]) py.decref(refs[k]);
  if (!ok) {
    py.err_clear();
    return -1;
  }
  v->data = (void *)(intptr_t)ptr;
  v->device.device_type = FUSEDK_DEVICE_CUDA, v->device.device_id = (int32_t)dev;
  v->ndim = (int32_t)n;
  v->dtype.code = (uint8_t)(c & 0xff), v->dtype.bits = (uint8_t)((c >> 8) & 0xff), v->dtype.lanes = (uint16_t)(c >> 16);
  v->shape = dims, v->strides = dims + n, v->byte_offset = 0;
  return 0;
}

/* A new array shaped like `like` (whose sizes are dims), on the current device. */
static void *attrs_new(const route *r, void *like, int64_t *dims, int ndim) {
  void *dt = py.getattr(like, "dtype"), *res = NULL;
  if (dt && r->init) {
    const fusedk__shape_vec shape = {dims, dims + ndim, dims + ndim};
    res = r->init(r->type, &shape, dt, py.none);
  } else if (dt) {
    void *shape = py.tuple_new(ndim); /* (dims): the output's own shape, not like's */
    for (int d = 0; shape && d < ndim; ++d) {
      void *v = py.long_from(dims[d]);
      if (v) {
        py.tuple_setitem(shape, d, v);
      } else {
        py.decref(shape);
        shape = NULL;
      }
    }
    void *argt = shape ? py.tuple_new(2) : NULL;
    if (argt) {
      py.tuple_setitem(argt, 0, shape); /* steals shape */
      py.incref(dt);
      py.tuple_setitem(argt, 1, dt);
      res = py.call(r->type, argt, NULL);
      py.decref(argt);
    } else if (shape) {
      py.decref(shape);
    }
  }
  if (dt) py.decref(dt);
  return res;
}

/* Runs registry op `op` on `args` (as exchange_call) whose arrays are CuPy-like instances of
   r->type, on `stream` (< 0: the current one). */
static void *attrs_call(route *r, int32_t op, void *args, const double *attrs, int64_t stream) {
  const fusedk_op *o = fusedk_op_get(op);
  if (!o) return failed(-1);
  fusedk_tensor view[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *t[FUSEDK_OP_MAX_TENSORS] = {0};
  int64_t dims[FUSEDK_OP_MAX_TENSORS][2 * FUSEDK_MAX_DIMS];
  void *obj[FUSEDK_OP_MAX_TENSORS] = {0};
  int owned[FUSEDK_OP_MAX_TENSORS] = {0}, n_out = 0, status = -1;
  for (int pass = 0; pass < 2; ++pass) /* inputs first: outputs are made like one of them */
    for (int i = 0; i < o->n_tensors; ++i) {
      const fusedk_op_tensor *a = &o->tensors[i];
      if ((a->kind >= FUSEDK_ARG_OUT) != pass) continue;
      obj[i] = py.tuple_getitem(args, i);
      if (!obj[i]) goto out;
      if (obj[i] == py.none) {
        obj[i] = NULL;
        if (!pass || !fusedk_op_out_exists(op, i, t, attrs)) continue;
        /* a required input missing, or an output of its own dtype (the table builders' float32)
           unlike its model input's (no dtype object here): the generic path takes the call */
        if (!obj[a->like]) goto out;
        const int32_t sc = fusedk_op_out_scalar(op, i, attrs);
        if (sc >= 0) {
          const fusedk_dtype want = fusedk_dtype_of((fusedk_scalar)sc), got = t[a->like]->dtype;
          if (want.code != got.code || want.bits != got.bits || want.lanes != got.lanes) goto out;
        }
        int64_t shp[FUSEDK_MAX_DIMS];
        const int32_t nd = fusedk_op_out_shape(op, i, t, attrs, shp);
        if (nd < 0) goto out;
        obj[i] = attrs_new(r, obj[a->like], shp, nd);
        if (!obj[i]) {
          status = fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: allocating %s through the framework failed", o->name,
                                a->name);
          goto out;
        }
        owned[i] = 1;
      } else if (py.isinstance(obj[i], r->type) != 1) {
        goto out;
      }
      if (attrs_view(r, obj[i], &view[i], dims[i])) goto out;
      t[i] = &view[i];
      n_out += pass;
      /* a new output lands on the current device: when x is elsewhere, the generic path (which
         switches devices) takes the call */
      if (owned[i] && view[i].device.device_id != view[a->like].device.device_id) goto out;
    }
  if (stream < 0) {
    stream = r->stream_ptr ? (int64_t)r->stream_ptr() : -1;
    if (stream == -1) { /* no C entry point, or it failed: the Python-level one */
      py.err_clear();
      void *none = py.tuple_new(0), *s = py.call(r->get_stream, none, NULL);
      py.decref(none);
      int err = 0;
      stream = s ? attr_ll(s, "ptr", &err) : -1;
      if (s) py.decref(s);
      if (!s || err) goto out;
    }
  }
  status = fusedk_op_call(op, t, attrs, (struct CUstream_st *)(intptr_t)stream);
  if (status == FUSEDK_OK) {
    void *res = results(o, t, obj, NULL, NULL, owned, n_out);
    if (res) return res; /* the owned outputs are in it (or were released by results) */
    return failed(FUSEDK_ERR_OUT_OF_MEMORY);
  }
out:
  py.err_clear();
  for (int i = 0; i < o->n_tensors; ++i)
    if (owned[i]) py.decref(obj[i]);
  return failed(status);
}

/* 1 where autograd records this call: an input requires grad and grad mode is on (asked only
   then: the no-grad and plain-tensor calls pay a few attribute reads). Its outputs then need a
   grad_fn (the framework's custom operator, FUSEDK_PY_AUTOGRAD), which no C route makes; -1
   where the answer could not be read. */
static int records_grad(const route *r, int32_t op, void *args) {
  static void *no_args;
  const fusedk_op *o = fusedk_op_get(op);
  long long rec = 0;
  for (int i = 0; o && i < o->n_tensors && rec == 0; ++i) {
    void *t = o->tensors[i].kind <= FUSEDK_ARG_IN_OPT ? py.tuple_getitem(args, i) : NULL;
    void *g = t && t != py.none ? py.getattr(t, "requires_grad") : NULL;
    if (!g) { /* not a tensor (the route's own checks see it), or no such attribute */
      py.err_clear();
      continue;
    }
    rec = py.as_longlong(g);
    py.decref(g);
  }
  if (rec == 1) {
    if (!no_args) no_args = py.tuple_new(0); /* kept for the process */
    void *on = no_args ? py.call(r->grad_mode, no_args, NULL) : NULL;
    rec = on ? py.as_longlong(on) : -1;
    if (on) py.decref(on);
  }
  if (rec < 0 || py.err_occurred()) return py.err_clear(), -1;
  return rec == 1;
}

static void *route_call(route *r, int32_t op, void *args, const double *attrs, int64_t stream) {
  if (r->grad_mode) {
    const int g = records_grad(r, op, args);
    if (g) return failed(g > 0 ? FUSEDK_PY_AUTOGRAD : -1);
  }
  return r->x ? exchange_call(r->x, op, args, attrs, stream) : attrs_call(r, op, args, attrs, stream);
}

/* The Python path's entry (ctypes): route i, attrs[FUSEDK_OP_MAX_ATTRS] (the op's attributes
   in registry order), stream < 0 the current one. Returns as exchange_call: None on failure,
   with fusedk_py_last() set. */
FUSEDK_DEF void *fusedk_py_call_route(int i, int32_t op, void *args, const double *attrs, int64_t stream) {
  if (i < 0 || i >= n_routes || !attrs) return failed(-1);
  return route_call(&routes[i], op, args, attrs, stream);
}

/* --- the builtin every op function calls -------------------------------------------------- */

static void *slow_fn, *failed_fn; /* Python callables: the path of an unrouted call; a failure's */

static void *call_python(void *fn, void *const *args, int n) {
  void *t = py.tuple_new(n);
  if (!t) return NULL;
  for (int i = 0; i < n; ++i) {
    py.incref(args[i]);
    py.tuple_setitem(t, i, args[i]);
  }
  void *r = py.call(fn, t, NULL);
  py.decref(t);
  return r;
}

/* call(op, x, args, attrs, stream): op an int, x the op's first input (its exact type picks the
   route), args the op's tensors in registry order, attrs a tuple of its leading attributes in
   registry order (the rest take their defaults), stream None or an int. Anything else (an
   unrouted type, a stream object, attributes that are not numbers) goes to
   slow(op, x, args, attrs, stream); a failure to failed(op, args, attrs, stream, status), which
   runs the generic path (status -1) or raises. */
static void *fast_call(void *self, void *const *args, intptr_t n) {
  (void)self;
  if (n != 5) return call_python(slow_fn, args, (int)n);
  void *tp = py.type_of(args[1]);
  py.decref(tp); /* kept alive by its instance */
  route *r = NULL;
  for (int i = 0; i < n_routes && !r; ++i)
    if (routes[i].type == tp) r = &routes[i];
  if (!r) return call_python(slow_fn, args, 5);
  /* each conversion only while nothing has failed (no CPython call with an error set) */
  long long op = py.as_longlong(args[0]), stream = -1;
  double attrs[FUSEDK_OP_MAX_ATTRS] = {0};
  int bad = py.err_occurred() != NULL || op < 0 || op >= FUSEDK_OP_COUNT;
  const fusedk_op *o = bad ? NULL : fusedk_op_get((int32_t)op);
  const intptr_t na = bad ? 0 : py.tuple_size(args[3]); /* not a tuple: -1 and an error */
  bad = bad || py.err_occurred() != NULL || na < 0 || na > o->n_attrs;
  for (int k = 0; !bad && k < o->n_attrs; ++k)
    attrs[k] = k < na ? py.as_double(py.tuple_getitem(args[3], k)) : o->attrs[k].value, bad = py.err_occurred() != NULL;
  if (!bad && args[4] != py.none) stream = py.as_longlong(args[4]), bad = py.err_occurred() != NULL || stream < 0;
  if (bad) {
    py.err_clear();
    return call_python(slow_fn, args, 5);
  }
  void *res = route_call(r, (int32_t)op, args[2], attrs, stream);
  if (res != py.none) return res;
  py.decref(res);
  /* the status travels as an argument: a finalizer's fusedk call on the way could overwrite
     this thread's `last` */
  void *st = py.long_from(last);
  if (!st) return NULL;
  void *const fa[5] = {args[0], args[2], args[3], args[4], st};
  res = call_python(failed_fn, fa, 5);
  py.decref(st);
  return res;
}

/* PyMethodDef, layout-identical; METH_FASTCALL (CPython >= 3.7) */
static struct { const char *name; void *meth; int flags; const char *doc; } fast_def = {
    "call", (void *)fast_call, 0x0080,
    "call(op, x, args, attrs, stream): runs registry op `op` (fusedk._core)"};

/* The builtin (a new reference), given the slow and failure callables; once per process. */
FUSEDK_DEF void *fusedk_py_fast(void *slow, void *fail) {
  py.incref(slow), py.incref(fail);
  slow_fn = slow, failed_fn = fail;
  return py.cfunction_new(&fast_def, NULL, NULL);
}

/* --- packed arrays ------------------------------------------------------------------------- */

/* One tensor slot as the bindings pack it: data, device type and id, ndim (-1: absent), dtype,
   then ndim sizes and ndim strides in BYTES (NumPy's and CuPy's own unit). */
typedef struct {
  int64_t data;
  int32_t device_type, device_id, ndim;
  uint8_t code, bits;
  uint16_t lanes;
} packed_head;

/* Runs registry op `op` on tensors packed one after another in `buf`, with attrs (all of the
   op's attributes, registry order). GIL-free (cffi). */
FUSEDK_DEF fusedk_status fusedk_op_call_packed(int32_t op, const void *buf, size_t len, const double *attrs,
                                               struct CUstream_st *stream) {
  const fusedk_op *o = fusedk_op_get(op);
  if (!o) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "op_call_packed: op %d is unknown", (int)op);
  fusedk_tensor view[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *t[FUSEDK_OP_MAX_TENSORS];
  int64_t st[FUSEDK_OP_MAX_TENSORS][FUSEDK_MAX_DIMS];
  const char *p = (const char *)buf, *end = p + len;
  for (int i = 0; i < o->n_tensors; ++i) {
    packed_head h;
    if (end - p < (ptrdiff_t)sizeof h) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: packed arguments are short", o->name);
    memcpy(&h, p, sizeof h);
    p += sizeof h;
    t[i] = NULL;
    if (h.ndim < 0) continue;
    fusedk_tensor *v = &view[i];
    t[i] = v;
    v->data = (void *)(intptr_t)h.data;
    v->device.device_type = h.device_type, v->device.device_id = h.device_id;
    v->ndim = h.ndim;
    v->dtype.code = h.code, v->dtype.bits = h.bits, v->dtype.lanes = h.lanes;
    v->byte_offset = 0;
    if (h.ndim > FUSEDK_MAX_DIMS) { /* packed without sizes; the op's validation names it in order */
      v->shape = v->strides = NULL;
      continue;
    }
    if (end - p < (ptrdiff_t)(16 * h.ndim)) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: packed arguments are short", o->name);
    v->shape = (int64_t *)(void *)p; /* 8-byte aligned: the bindings pack 24 + 8k bytes a slot */
    const int64_t item = h.bits / 8 * (h.lanes ? h.lanes : 1);
    for (int d = 0; d < h.ndim; ++d) {
      int64_t b;
      memcpy(&b, p + 8 * (h.ndim + d), 8);
      if (item <= 0 || b % item)
        return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has a stride of %lld bytes in dim %d, not a multiple of its "
                            "%lld-byte elements", o->name, o->tensors[i].name, (long long)b, d, (long long)item);
      st[i][d] = b / item;
    }
    v->strides = st[i];
    p += 16 * h.ndim;
  }
  return fusedk_op_call(op, t, attrs, stream);
}
