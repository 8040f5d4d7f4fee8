/* runtime.c -- runs a bundle on the host (target cpu) or on a CUDA device
 * through the driver API loaded with dlopen (see runtime.h).
 *
 * ap_runtime_new first checks the whole bundle against itself (indices,
 * counts, dtypes, sizes, workspace bounds, and every kernel blob against
 * its SHA-256 digest, before anything is loaded: a blob is native code) so
 * that running it can only fail in a kernel; then it loads the kernels and
 * allocates the buffers.  The
 * host path keeps one pointer per buffer (intermediates point into the one
 * workspace) and a small thread pool: for each launch the main thread and
 * the workers take chunks of the block range from an atomic counter until
 * it is exhausted, then the main thread waits for all of them before the
 * next launch (launches are ordered; blocks within one are independent).
 * The CUDA path keeps one CUdeviceptr per buffer and launches on the null
 * stream, synchronising at the end of ap_runtime_run, or on the caller's
 * stream without waiting (ap_runtime_run_stream); intermediates live in the
 * workspace of the run's stream (one per stream), and the zeroing a run
 * needs is queued on its stream before its launches.  Before anything is
 * launched, ap_runtime_new checks the launch contract (runtime.h): the
 * blobs' architectures, then every launch against the function's and the
 * device's limits.
 *
 * A buffer's storage is either the runtime's own (allocated zeroed, freed
 * with the runtime) or the caller's (ap_runtime_bind_ptr: never freed
 * here).  With ap_runtime_options.external no input, param or output is
 * allocated up front; own storage is then made when a buffer is bound by
 * copy or an output was never bound.
 */
#include "runtime.h"
#include "hostcheck.h"
#include "library.h"
#include "../common/tmap.h"

#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto/apollo.pb-c.h"

typedef void (*host_kernel_fn)(void *const *args, unsigned block_begin, unsigned block_end);

/* ---- CUDA driver API, declared here: no header, no link dependency ---------- */

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;

/* CUfunction_attribute, CUdevice_attribute and CUresult values used here
 * (CUDA driver API reference; cuda.h of CUDA 13.0). */
enum {
	AP_CU_FUNC_MAX_THREADS_PER_BLOCK = 0,
	AP_CU_FUNC_SHARED_SIZE_BYTES = 1,
	AP_CU_FUNC_NUM_REGS = 4,
	AP_CU_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
	AP_CU_FUNC_CLUSTER_SIZE_MUST_BE_SET = 10,
	AP_CU_FUNC_REQUIRED_CLUSTER_WIDTH = 11,      /* HEIGHT 12, DEPTH 13 */
	AP_CU_FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14,
};
enum {
	AP_CU_DEV_MAX_THREADS_PER_BLOCK = 1,
	AP_CU_DEV_MAX_BLOCK_DIM_X = 2,               /* Y 3, Z 4 */
	AP_CU_DEV_MAX_GRID_DIM_X = 5,                /* Y 6, Z 7 */
	AP_CU_DEV_MULTIPROCESSOR_COUNT = 16,
	AP_CU_DEV_COMPUTE_CAPABILITY_MAJOR = 75,
	AP_CU_DEV_COMPUTE_CAPABILITY_MINOR = 76,
	AP_CU_DEV_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
	AP_CU_DEV_CLUSTER_LAUNCH = 120,
};
#define AP_CU_ERROR_NO_BINARY_FOR_GPU 209
#define AP_CU_EVENT_DISABLE_TIMING 0x2
/* A portable thread-block cluster holds at most 8 blocks; a function that
 * allows non-portable sizes up to 16 (CU_FUNC_ATTRIBUTE_NON_PORTABLE_
 * CLUSTER_SIZE_ALLOWED; sm_90). */
#define AP_CLUSTER_PORTABLE 8
#define AP_CLUSTER_NON_PORTABLE 16
/* Streams a GPU runtime keeps a workspace for (see run_gpu). */
#define AP_RT_MAX_STREAMS 8

typedef struct cuda_api {
	void *lib;
	CUresult (*cuInit)(unsigned);
	CUresult (*cuDeviceGetCount)(int *);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuModuleLoadData)(CUmodule *, const void *);
	CUresult (*cuDriverGetVersion)(int *);       /* optional */
	CUresult (*cuModuleUnload)(CUmodule);
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
	CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
	CUresult (*cuMemFree)(CUdeviceptr);
	CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
	CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
				   unsigned, unsigned, CUstream, void **, void **);
	CUresult (*cuGetErrorString)(CUresult, const char **);
	/* optional: device facts (tuning reports) and event timing (profile);
	 * NULL when the driver lacks them (then profile times on the host clock) */
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*cuEventCreate)(CUevent *, unsigned);
	CUresult (*cuEventDestroy)(CUevent);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
	/* optional: the launch contract's facts (NULL: not checked), ordering
	 * the legacy stream's copies before a run on another stream (NULL:
	 * cuCtxSynchronize instead), error names */
	CUresult (*cuFuncGetAttribute)(int *, int, CUfunction);
	CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
	CUresult (*cuGetErrorName)(CUresult, const char **);
	/* optional (CUDA 12+): tensor maps for TMA kernels (a bundle with one
	 * is refused without it) */
	CUresult (*cuTensorMapEncodeTiled)(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
					   const uint32_t *, const uint32_t *, int, int, int, int);
} cuda_api;

/* A CUtensorMap: 128 opaque bytes, 64-byte aligned (CUDA Driver API). */
typedef struct rt_tmap {
	_Alignas(64) unsigned long long w[16];
} rt_tmap;

/* ---- the runtime ---------------------------------------------------------------- */

/* What the driver says of one function (cuFuncGetAttribute); -1 where it
 * did not answer. */
typedef struct cu_fn_facts {
	int max_threads;         /* per block: .maxntid / launch bounds, registers */
	int static_smem;         /* bytes */
	int regs;                /* per thread */
	int max_dyn_smem;        /* bytes a launch may ask for now */
	int cluster[3];          /* required (compile-time) cluster dims; 0 0 0: none */
	int cluster_must;        /* 1: launches must give a cluster */
	int non_portable;        /* 1: up to 16 blocks per cluster */
} cu_fn_facts;

/* The device's limits (cuDeviceGetAttribute); -1 where it did not answer. */
typedef struct cu_dev_facts {
	int sm;                  /* compute capability major * 10 + minor */
	int max_threads;
	int max_block[3], max_grid[3];
	int smem_optin;          /* shared memory per block, opting in, bytes */
	int cluster_launch;      /* 1: thread-block clusters */
	char name[128];
} cu_dev_facts;

typedef struct rt_kernel {
	const Apollo__Kernel *pb;
	host_kernel_fn fn;       /* host */
	const unsigned long long *extents; /* host: bytes each param may touch, from the
					      object itself (NAME_ap_extents); NULL: not said */
	int lib;                 /* host: index into rt->libs */
	int *fault;              /* host: the object's ap_host_fault (a kernel with
				    warp-specialised arms sets it at a deadlock); NULL:
				    none exported */
	CUfunction cufn;         /* GPU */
	CUmodule cumod;          /* GPU: owned when cumod_owner */
	bool cumod_owner;
	cu_fn_facts facts;       /* GPU */
	unsigned long long blocks;
	int n_tmaps;             /* its params with a tensor map (apollo.TensorMap) */
	ap_tmap_desc *tmap;      /* their descriptions, parsed once at load (owned) */
	size_t *tmap_param;      /* and the param each belongs to (owned) */
} rt_kernel;

typedef struct rt_buffer {
	const Apollo__Buffer *pb;
	void *host;              /* host: data (intermediates point into the workspace) */
	bool host_owned;
	CUdeviceptr dev;         /* GPU */
	bool dev_owned;
	bool zero_pending;       /* GPU, own storage: zeroed on the next run's stream */
	bool has_storage;        /* host / dev points at memory (own or the caller's) */
	bool bound;              /* INPUT/PARAM: data was given */
} rt_buffer;

typedef struct pool {
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	int n_workers;
	pthread_t *tids;
	uint64_t gen;
	int active;
	bool stop;
	/* current launch */
	host_kernel_fn fn;
	void *const *args;
	unsigned total, chunk;
	atomic_ullong next;
} pool;

struct ap_runtime {
	const Apollo__Bundle *b;
	bool host;
	bool checked;            /* host kernels printed in the checking mode (hostcheck.h) */
	bool external;           /* no I/O buffer allocated up front */
	int n_kernels;
	rt_kernel *kernels;
	int n_libs;
	void **libs;
	int *lib_fds;            /* memfds kept open while their object is loaded */
	int n_buffers;
	rt_buffer *buffers;
	void *workspace;         /* host */
	int n_inputs, n_outputs;
	int max_args;
	int n_tmaps;             /* most tensor maps of a kernel */
	/* the plan's tensor maps as last encoded (run_gpu, encode_tmaps):
	 * launch l's at map_cache[map_first[l] ..], each with the address it
	 * was encoded for (0: not yet) -- a map is encoded again only when
	 * its buffer's address changed (ap_runtime_bind_ptr, another stream's
	 * workspace).  The kernel's parameters copy it at each launch. */
	rt_tmap *map_cache;
	CUdeviceptr *map_addr;
	size_t *map_first;
	void **argv;             /* host: scratch argument array */
	pool *pool;
	double *launch_ms;       /* profile: per launch of the plan, summed over runs */
	/* GPU */
	cuda_api cu;
	bool cu_ready;
	CUdevice dev;
	CUcontext ctx;
	CUevent ev[2];           /* profile: around each launch (NULL: host clock) */
	cu_dev_facts dev_facts;
	/* one workspace per stream the plan ran on (run_gpu); ws[0] is made
	 * by ap_runtime_new and taken by the first run's stream */
	struct rt_ws {
		CUstream stream;
		CUdeviceptr dev;
		bool taken;      /* stream is its owner */
		bool zeroed;     /* its zeroing was queued on that stream */
	} ws[AP_RT_MAX_STREAMS];
	int n_ws;
	bool legacy_pending;     /* copies on the legacy stream no run waited for yet */
	CUevent copy_ev;         /* marks them for a run on another stream */
	/* library launches (library.h): cuBLASLt when it loaded, each launch's
	 * cached plan; lib_why says why a launch runs Apollo's kernel instead */
	ap_cublaslt *lt;
	ap_lib_plan **lib_plans; /* per launch of the plan */
	int lib_launches;        /* launches with a LibraryCall */
	int lib_fallbacks;       /* of those, run with Apollo's kernel (last run) */
	char lib_why[512];
};

/* The driver's words for r, with its name where the driver gives one
 * ("an illegal memory access was encountered (CUDA_ERROR_ILLEGAL_ADDRESS)").
 * One buffer per thread: use once per message. */
static const char *cu_err(const cuda_api *cu, CUresult r)
{
	static _Thread_local char buf[256];
	const char *s = NULL, *name = NULL;

	if (!cu->cuGetErrorString || cu->cuGetErrorString(r, &s) != 0 || !s)
		s = "unknown CUDA error";
	if (cu->cuGetErrorName && cu->cuGetErrorName(r, &name) == 0 && name)
		snprintf(buf, sizeof(buf), "%s (%s)", s, name);
	else
		snprintf(buf, sizeof(buf), "%s (CUresult %d)", s, (int)r);
	return buf;
}

/* ---- bundle checks ------------------------------------------------------------- */

static bool is_gpu_target(const char *t)
{
	return !strncmp(t, "sm_", 3) || !strncmp(t, "compute_", 8);
}

static int check_buffer(const Apollo__Bundle *b, size_t i, ap_error *err)
{
	const Apollo__Buffer *bf = b->buffers[i];
	size_t es;
	uint64_t n = 1;

	if (!bf)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "bundle buffer %zu is empty", i);
	if (bf->kind > APOLLO__BUFFER_KIND__BUF_CONST)
		return ap_error_set(err, AP_EINVAL, NULL, bf->name,
				    "buffer %zu has unknown kind %d", i, (int)bf->kind);
	es = ap_dtype_size((ap_dtype)bf->dtype);
	if (es == 0)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, bf->name,
				    "buffer '%s' has unsupported dtype %d", bf->name, (int)bf->dtype);
	if (bf->n_dims > AP_MAX_RANK)
		return ap_error_set(err, AP_EINVAL, NULL, bf->name,
				    "buffer '%s' has rank %zu > %d", bf->name, bf->n_dims, AP_MAX_RANK);
	for (size_t d = 0; d < bf->n_dims; d++) {
		if (bf->dims[d] < 0 || bf->dims[d] > AP_MAX_ELEMENTS)
			return ap_error_set(err, AP_EINVAL, NULL, bf->name,
					    "buffer '%s' has dim %lld", bf->name,
					    (long long)bf->dims[d]);
		/* bounded before multiplying: [2^35, 2^35] must not wrap to 0 */
		if (bf->dims[d] && n > (uint64_t)AP_MAX_ELEMENTS / (uint64_t)bf->dims[d])
			return ap_error_set(err, AP_ETOOLARGE, NULL, bf->name,
					    "buffer '%s' holds more than 2^36 elements", bf->name);
		n *= (uint64_t)bf->dims[d];
	}
	if (n * es != bf->bytes)
		return ap_error_set(err, AP_EINVAL, NULL, bf->name,
				    "buffer '%s' says %llu bytes but its shape and dtype make %llu",
				    bf->name, (unsigned long long)bf->bytes,
				    (unsigned long long)(n * es));
	if (bf->kind != APOLLO__BUFFER_KIND__BUF_CONST && bf->data.len > 0)
		return ap_error_set(err, AP_EINVAL, NULL, bf->name,
				    "buffer '%s' carries data but is not a constant", bf->name);
	if (bf->kind == APOLLO__BUFFER_KIND__BUF_CONST && bf->data.len != bf->bytes)
		return ap_error_set(err, AP_EINVAL, NULL, bf->name,
				    "constant '%s' carries %zu bytes of data for %llu", bf->name,
				    bf->data.len, (unsigned long long)bf->bytes);
	if (bf->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE &&
	    (bf->offset > b->workspace_bytes || bf->bytes > b->workspace_bytes - bf->offset))
		return ap_error_set(err, AP_EINVAL, NULL, bf->name,
				    "intermediate '%s' [%llu, +%llu) lies outside the %llu-byte workspace",
				    bf->name, (unsigned long long)bf->offset,
				    (unsigned long long)bf->bytes,
				    (unsigned long long)b->workspace_bytes);
	if ((bf->kind == APOLLO__BUFFER_KIND__BUF_INPUT ||
	     bf->kind == APOLLO__BUFFER_KIND__BUF_OUTPUT) &&
	    (bf->index < 0 || (size_t)bf->index >= b->n_buffers))
		return ap_error_set(err, AP_EINVAL, NULL, bf->name,
				    "buffer '%s' has index %d", bf->name, (int)bf->index);
	return 0;
}

static int tmap_of(const Apollo__KernelParam *pp, ap_tmap_desc *d, char *why, size_t cap);
static int map_cache_new(ap_runtime *rt, ap_error *err);

/* Kernel k's tensor maps (k->n_tmaps of them, the bundle already checked:
 * tmap_of accepted each) parsed into k->tmap / k->tmap_param once, for
 * every launch's encoding.  0, or AP_ENOMEM / AP_EINVAL with err. */
static int parse_tmaps(rt_kernel *k, ap_error *err)
{
	const Apollo__Kernel *kk = k->pb;
	char why[160];
	int m = 0;

	k->tmap = calloc((size_t)k->n_tmaps, sizeof(*k->tmap));
	k->tmap_param = calloc((size_t)k->n_tmaps, sizeof(*k->tmap_param));
	if (!k->tmap || !k->tmap_param)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (size_t a = 0; a < kk->n_params && m < k->n_tmaps; a++) {
		if (!kk->params[a]->tmap)
			continue;
		if (tmap_of(kk->params[a], &k->tmap[m], why, sizeof(why)) < 0)
			return ap_error_set(err, AP_EINVAL, kk->name, NULL, "kernel '%s': %s", kk->name, why);
		k->tmap_param[m++] = a;
	}
	return 0;
}

/* The tensor map of param pp (apollo.TensorMap) as a description: every
 * repeated field as long as its rank says, the param's element type, and
 * what cuTensorMapEncodeTiled accepts (ap_tmap_check).  0, or -1 with the
 * reason in why. */
static int tmap_of(const Apollo__KernelParam *pp, ap_tmap_desc *d, char *why, size_t cap)
{
	const Apollo__TensorMap *m = pp->tmap;
	size_t r = m->rank;

	if (r < 1 || r > AP_TMAP_MAX_RANK || m->n_dims != r || m->n_strides != r - 1 || m->n_box != r ||
	    m->n_element_strides != r) {
		snprintf(why, cap, "rank %u with %zu dims, %zu strides, %zu box and %zu element-stride values",
			 m->rank, m->n_dims, m->n_strides, m->n_box, m->n_element_strides);
		return -1;
	}
	if (ap_tmap_dtype_of((int)pp->dtype) != m->dtype) {
		snprintf(why, cap, "data type %d does not hold the param's %s", m->dtype,
			 ap_dtype_name((ap_dtype)pp->dtype));
		return -1;
	}
	memset(d, 0, sizeof(*d));
	d->dtype = m->dtype;
	d->rank = (int)r;
	for (size_t i = 0; i < r; i++) {
		d->dims[i] = m->dims[i];
		d->box[i] = m->box[i];
		d->estrides[i] = m->element_strides[i];
		if (i + 1 < r)
			d->strides[i] = m->strides[i];
	}
	d->interleave = m->interleave;
	d->swizzle = m->swizzle;
	d->l2 = m->l2_promotion;
	d->oob = m->oob_fill;
	return ap_tmap_check(d, NULL, why, cap);
}

/* Bytes of the buffer a tensor map may read: its last element's end
 * (ULLONG_MAX when that overflows: dims up to 2^32 times strides below
 * 2^40 do not fit 64 bits). */
static unsigned long long tmap_extent(const ap_tmap_desc *d)
{
	unsigned long long e, t;

	if (__builtin_mul_overflow(d->dims[0], (unsigned long long)ap_tmap_elem_bytes(d->dtype), &e))
		return ULLONG_MAX;
	for (int i = 1; i < d->rank; i++)
		if (__builtin_mul_overflow(d->dims[i] - 1, d->strides[i - 1], &t) || __builtin_add_overflow(e, t, &e))
			return ULLONG_MAX;
	return e;
}

/* Kernel k of bundle b: a name, 3 grid and 3 block dims, none zero, at
 * most 2^32 blocks, a blob (its own, or an earlier kernel's) that matches
 * its SHA-256 digest, no empty param.  0 or AP_EINVAL / AP_ETOOLARGE. */
static int check_bundle_kernel(const Apollo__Bundle *b, size_t k, ap_error *err)
{
	const Apollo__Kernel *kk = b->kernels[k];
	const ProtobufCBinaryData *blob;
	unsigned long long blocks = 1;
	uint8_t d[32];

	if (!kk || !kk->name || !*kk->name)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "kernel %zu has no name", k);
	if (kk->n_grid != 3 || kk->n_block != 3)
		return ap_error_set(err, AP_EINVAL, kk->name, NULL,
				    "kernel '%s' has %zu grid and %zu block values, not 3",
				    kk->name, kk->n_grid, kk->n_block);
	for (int d = 0; d < 3; d++) {
		if (kk->grid[d] == 0 || kk->block[d] == 0)
			return ap_error_set(err, AP_EINVAL, kk->name, NULL,
					    "kernel '%s' has a zero grid or block dimension",
					    kk->name);
		blocks *= kk->grid[d];
	}
	if (blocks > UINT32_MAX)
		return ap_error_set(err, AP_ETOOLARGE, kk->name, NULL,
				    "kernel '%s' has %llu blocks", kk->name, blocks);
	blob = ap_bundle_pb_kernel_blob(b, k);
	if (!blob || (kk->blob_of && kk->blob.len))
		return ap_error_set(err, AP_EINVAL, kk->name, NULL,
				    "kernel '%s' shares the blob of kernel %u, which is not an "
				    "earlier kernel with a blob of its own", kk->name,
				    kk->blob_of - 1);
	if (blob->len == 0)
		return ap_error_set(err, AP_EINVAL, kk->name, NULL,
				    "kernel '%s' has an empty blob", kk->name);
	if (kk->digest.len != 32)
		return ap_error_set(err, AP_EINVAL, kk->name, NULL,
				    "kernel '%s' carries no SHA-256 digest of its blob", kk->name);
	/* a shared blob is hashed once, with its owner (checked before) */
	if (!kk->blob_of)
		ap_sha256(blob->data, blob->len, d);
	if (memcmp(kk->blob_of ? b->kernels[kk->blob_of - 1]->digest.data : d, kk->digest.data, 32))
		return ap_error_set(err, AP_EINVAL, kk->name, NULL,
				    "kernel '%s': its blob does not match its digest; "
				    "not loading it", kk->name);
	for (size_t p = 0; p < kk->n_params; p++) {
		ap_tmap_desc d;
		char why[160];

		if (!kk->params[p])
			return ap_error_set(err, AP_EINVAL, kk->name, NULL,
					    "kernel '%s' param %zu is empty", kk->name, p);
		if (kk->params[p]->tmap && tmap_of(kk->params[p], &d, why, sizeof(why)) < 0)
			return ap_error_set(err, AP_EINVAL, kk->name, NULL,
					    "kernel '%s' param %zu's tensor map: %s", kk->name, p, why);
	}
	return 0;
}

/* Launch l of bundle b: a kernel of the bundle, one argument per param,
 * each a buffer of the bundle at least as large as the bytes it may
 * touch, of the param's type, never an input, param or constant written,
 * no two intermediates overlapping in the workspace, and its library call
 * (ap_library_check).  0 or a negative AP_E* code. */
static int check_bundle_launch(const Apollo__Bundle *b, size_t l, ap_error *err)
{
	const Apollo__Launch *la = b->plan[l];
	const Apollo__Kernel *kk;

	if (!la || la->kernel >= b->n_kernels)
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "launch %zu names kernel %u of %zu", l,
				    la ? la->kernel : 0, b->n_kernels);
	kk = b->kernels[la->kernel];
	if (la->n_args != kk->n_params)
		return ap_error_set(err, AP_EINVAL, kk->name, NULL,
				    "launch %zu of kernel '%s' binds %zu arguments to %zu params",
				    l, kk->name, la->n_args, kk->n_params);
	if (la->n_arg_bytes != la->n_args)
		return ap_error_set(err, AP_EINVAL, kk->name, NULL,
				    "launch %zu of kernel '%s' says how many bytes %zu of its %zu "
				    "arguments may touch", l, kk->name, la->n_arg_bytes, la->n_args);
	for (size_t a = 0; a < la->n_args; a++) {
		const Apollo__Buffer *bf;
		const Apollo__KernelParam *pp = kk->params[a];
		if (la->args[a] >= b->n_buffers)
			return ap_error_set(err, AP_EINVAL, kk->name, NULL,
					    "launch %zu of kernel '%s': argument %zu names buffer %u of %zu",
					    l, kk->name, a, la->args[a], b->n_buffers);
		bf = b->buffers[la->args[a]];
		if (bf->bytes < la->arg_bytes[a])
			return ap_error_set(err, AP_EINVAL, kk->name, bf->name,
					    "launch %zu of kernel '%s': argument %zu may touch %llu bytes "
					    "but buffer '%s' has %llu", l, kk->name, a,
					    (unsigned long long)la->arg_bytes[a], bf->name,
					    (unsigned long long)bf->bytes);
		if (pp->tmap) {
			ap_tmap_desc d;
			char why[160];

			if (tmap_of(pp, &d, why, sizeof(why)) < 0)
				return ap_error_set(err, AP_EINVAL, kk->name, bf->name,
						    "launch %zu of kernel '%s': param '%s''s tensor map: %s", l,
						    kk->name, pp->name, why);
			if (tmap_extent(&d) > bf->bytes)
				return ap_error_set(err, AP_EINVAL, kk->name, bf->name,
						    "launch %zu of kernel '%s': param '%s''s tensor map reaches "
						    "byte %llu of buffer '%s' (%llu bytes)", l, kk->name, pp->name,
						    tmap_extent(&d), bf->name, (unsigned long long)bf->bytes);
		}
		if (pp->dtype != APOLLO__DATA_TYPE__DT_UNDEFINED && pp->dtype != bf->dtype)
			return ap_error_set(err, AP_EINVAL, kk->name, bf->name,
					    "launch %zu of kernel '%s': param '%s' is %s but buffer '%s' is %s",
					    l, kk->name, pp->name,
					    ap_dtype_name((ap_dtype)pp->dtype), bf->name,
					    ap_dtype_name((ap_dtype)bf->dtype));
		if (pp->written && (bf->kind == APOLLO__BUFFER_KIND__BUF_INPUT ||
				    bf->kind == APOLLO__BUFFER_KIND__BUF_PARAM ||
				    bf->kind == APOLLO__BUFFER_KIND__BUF_CONST))
			return ap_error_set(err, AP_EINVAL, kk->name, bf->name,
					    "kernel '%s' writes %s buffer '%s'", kk->name,
					    bf->kind == APOLLO__BUFFER_KIND__BUF_INPUT ? "input"
					    : bf->kind == APOLLO__BUFFER_KIND__BUF_PARAM ? "param"
					    : "constant", bf->name);
		/* two tensors one launch binds are live at once, so the
		 * planner never lets them share workspace bytes (plan.c);
		 * aliased arguments would let a kernel's writes through one
		 * reach what it reads through the other */
		for (size_t a2 = 0; a2 < a; a2++) {
			const Apollo__Buffer *o = b->buffers[la->args[a2]];

			if (la->args[a2] != la->args[a] && bf->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE &&
			    o->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE && bf->bytes && o->bytes &&
			    bf->offset < o->offset + o->bytes && o->offset < bf->offset + bf->bytes)
				return ap_error_set(err, AP_EINVAL, kk->name, bf->name,
						    "launch %zu of kernel '%s': intermediates '%s' and '%s' "
						    "overlap in the workspace", l, kk->name, o->name, bf->name);
		}
	}
	return ap_library_check(b, l, err);
}

/* Everything of bundle b the runtime relies on before it allocates or
 * launches (the bundle is untrusted): counts within int, every buffer
 * (check_buffer), a workspace no larger than its intermediates and
 * library scratch need, unique input and output positions, every kernel
 * (check_bundle_kernel) and launch (check_bundle_launch).  0 or a
 * negative AP_E* code with the field named in err. */
static int check_bundle(const Apollo__Bundle *b, ap_error *err)
{
	uint64_t need = 0;   /* the end of the last intermediate in the workspace */
	int rc;

	if (b->n_kernels > INT32_MAX || b->n_buffers > INT32_MAX || b->n_plan > INT32_MAX)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "bundle too large");
	for (size_t i = 0; i < b->n_buffers; i++) {
		if ((rc = check_buffer(b, i, err)) < 0)
			return rc;
		if (b->buffers[i]->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE &&
		    b->buffers[i]->offset + b->buffers[i]->bytes > need)
			need = b->buffers[i]->offset + b->buffers[i]->bytes;   /* bounded by check_buffer */
	}
	/* a library call's scratch slice counts as well (its bounds are
	 * checked with its launch, ap_library_check) */
	for (size_t l = 0; l < b->n_plan; l++) {
		uint64_t e = b->plan[l] ? ap_library_workspace_end(b->plan[l]) : 0;

		if (e > b->workspace_bytes)
			e = b->workspace_bytes;   /* past it: refused with its launch */
		if (e > need)
			need = e;
	}
	/* the workspace is allocated from this number: no more than its
	 * intermediates need (the planner aligns them to 256 bytes) */
	if (b->workspace_bytes > need + 256)
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "the bundle asks for a %llu-byte workspace but its intermediates end "
				    "at byte %llu", (unsigned long long)b->workspace_bytes,
				    (unsigned long long)need);
	/* INPUT and OUTPUT positions must be unique. */
	for (size_t i = 0; i < b->n_buffers; i++) {
		const Apollo__Buffer *x = b->buffers[i];
		if (x->kind != APOLLO__BUFFER_KIND__BUF_INPUT &&
		    x->kind != APOLLO__BUFFER_KIND__BUF_OUTPUT)
			continue;
		for (size_t j = i + 1; j < b->n_buffers; j++) {
			const Apollo__Buffer *y = b->buffers[j];
			if (y->kind == x->kind && y->index == x->index)
				return ap_error_set(err, AP_EINVAL, NULL, y->name,
						    "buffers '%s' and '%s' share %s index %d",
						    x->name, y->name,
						    x->kind == APOLLO__BUFFER_KIND__BUF_INPUT ? "input"
											       : "output",
						    (int)x->index);
		}
	}
	for (size_t k = 0; k < b->n_kernels; k++)
		if ((rc = check_bundle_kernel(b, k, err)) < 0)
			return rc;
	for (size_t l = 0; l < b->n_plan; l++)
		if ((rc = check_bundle_launch(b, l, err)) < 0)
			return rc;
	return 0;
}

int ap_runtime_check(const ap_bundle *bundle, ap_error *err)
{
	return check_bundle(ap_bundle_pb(bundle), err);
}

/* ---- host: loading shared objects ------------------------------------------------ */

/* Loads one shared object from memory.  The memfd stays open (returned in
 * *keep_fd) while the object is loaded: the dynamic loader matches
 * already-loaded objects by path first, so a closed and reused descriptor
 * number ("/proc/self/fd/N") would alias another kernel's object. */
static void *load_so(const uint8_t *blob, size_t len, const char *kname, int *keep_fd,
		     ap_error *err)
{
	char path[64], tmpl[4096];
	void *h;
	int fd;
	bool tmpfile = false;

	fd = memfd_create("apollo-kernel", MFD_CLOEXEC);
	if (fd < 0) {
		const char *dir = getenv("TMPDIR");
		snprintf(tmpl, sizeof(tmpl), "%s/apollo-kernel-XXXXXX.so",
			 dir && *dir ? dir : "/tmp");
		fd = mkstemps(tmpl, 3);
		if (fd < 0) {
			ap_error_set(err, AP_EIO, kname, NULL,
				     "cannot create a file for kernel '%s': %m", kname);
			return NULL;
		}
		tmpfile = true;
	}
	for (size_t off = 0; off < len;) {
		ssize_t n = write(fd, blob + off, len - off);
		if (n < 0) {
			ap_error_set(err, AP_EIO, kname, NULL, "writing kernel '%s': %m", kname);
			close(fd);
			if (tmpfile)
				unlink(tmpl);
			return NULL;
		}
		off += (size_t)n;
	}
	*keep_fd = -1;
	if (tmpfile) {
		h = dlopen(tmpl, RTLD_NOW | RTLD_LOCAL);
		unlink(tmpl);
		close(fd);
	} else {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (h)
			*keep_fd = fd;
		else
			close(fd);
	}
	if (!h) {
		const char *e = dlerror();
		ap_error_set(err, AP_ECOMPILE, kname, NULL,
			     "cannot load kernel '%s' (%zu-byte shared object): %s", kname, len,
			     e ? e : "dlopen failed");
	}
	return h;
}

/* The plan's per-argument bytes against what each kernel's own object says
 * it may touch (its NAME_ap_extents, which the blob's digest vouches for):
 * a plan that claims less than the kernel touches would let a buffer the
 * size of the claim be overrun. */
static int host_extents(const ap_runtime *rt, ap_error *err)
{
	const Apollo__Bundle *b = rt->b;

	for (size_t l = 0; l < b->n_plan; l++) {
		const Apollo__Launch *la = b->plan[l];
		const rt_kernel *k = &rt->kernels[la->kernel];

		for (size_t a = 0; k->extents && a < la->n_args; a++)
			if (la->arg_bytes[a] < k->extents[a])
				return ap_error_set(err, AP_EINVAL, k->pb->name, NULL,
						    "launch %zu: kernel '%s' may touch %llu bytes of argument "
						    "%zu, but the plan says %llu", l, k->pb->name,
						    k->extents[a], a, (unsigned long long)la->arg_bytes[a]);
	}
	return 0;
}

static int host_load(ap_runtime *rt, ap_error *err)
{
	const Apollo__Bundle *b = rt->b;

	rt->libs = calloc(b->n_kernels ? b->n_kernels : 1, sizeof(void *));
	rt->lib_fds = calloc(b->n_kernels ? b->n_kernels : 1, sizeof(int));
	if (!rt->libs || !rt->lib_fds)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int k = 0; k < rt->n_kernels; k++) {
		const Apollo__Kernel *kk = b->kernels[k];
		const ProtobufCBinaryData *blob = ap_bundle_pb_kernel_blob(b, (size_t)k);
		int lib = -1;
		void *sym;
		/* Kernels sharing one blob share one loaded object. */
		for (int j = 0; j < k && lib < 0; j++) {
			const ProtobufCBinaryData *o = ap_bundle_pb_kernel_blob(b, (size_t)j);
			if (o->len == blob->len &&
			    (o->data == blob->data || !memcmp(o->data, blob->data, blob->len)))
				lib = rt->kernels[j].lib;
		}
		if (lib < 0) {
			int fd;
			void *h = load_so(blob->data, blob->len, kk->name, &fd, err);
			if (!h)
				return err ? err->code : AP_ECOMPILE;
			lib = rt->n_libs;
			rt->lib_fds[lib] = fd;
			rt->libs[rt->n_libs++] = h;
		}
		rt->kernels[k].lib = lib;
		{
			/* a checked object: point it at the checker */
			const ap_hcheck_ops **ck = dlsym(rt->libs[lib], "ap_check_rt");

			if (ck) {
				*ck = ap_hostcheck_ops();
				rt->checked = true;
			}
		}
		dlerror();
		sym = dlsym(rt->libs[lib], kk->name);
		if (!sym)
			return ap_error_set(err, AP_ECOMPILE, kk->name, NULL,
					    "kernel '%s' is not exported by its shared object",
					    kk->name);
		/* POSIX: dlsym's result converts to a function pointer. */
		memcpy(&rt->kernels[k].fn, &sym, sizeof(sym));
		{
			char ext[300];

			snprintf(ext, sizeof(ext), "%s_ap_extents", kk->name);
			rt->kernels[k].extents = dlsym(rt->libs[lib], ext);
		}
		rt->kernels[k].fault = dlsym(rt->libs[lib], "ap_host_fault");
	}
	return host_extents(rt, err);
}

static void *host_alloc(uint64_t bytes)
{
	void *p = NULL;
	size_t n = bytes ? (size_t)bytes : 1;

	if (bytes > SIZE_MAX - 64)
		return NULL;
	n = (n + 63) & ~(size_t)63;
	if (posix_memalign(&p, 64, n) != 0)
		return NULL;
	memset(p, 0, n);
	return p;
}

static int own_storage(ap_runtime *rt, rt_buffer *bf, ap_error *err);

static int host_alloc_all(ap_runtime *rt, ap_error *err)
{
	rt->workspace = host_alloc(rt->b->workspace_bytes);
	if (!rt->workspace)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL,
				    "out of memory for a %llu-byte workspace",
				    (unsigned long long)rt->b->workspace_bytes);
	for (int i = 0; i < rt->n_buffers; i++) {
		rt_buffer *bf = &rt->buffers[i];
		if (bf->pb->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE) {
			bf->host = (uint8_t *)rt->workspace + bf->pb->offset;
			bf->has_storage = true;
			continue;
		}
		if (!rt->external && own_storage(rt, bf, err) < 0)
			return err ? err->code : AP_ENOMEM;
	}
	rt->argv = calloc(rt->max_args ? (size_t)rt->max_args : 1, sizeof(void *));
	if (!rt->argv)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	return 0;
}

/* ---- host: thread pool ---------------------------------------------------------- */

static void pool_run_chunks(pool *p)
{
	for (;;) {
		unsigned long long begin = atomic_fetch_add(&p->next, p->chunk);
		unsigned long long end = begin + p->chunk;
		if (begin >= p->total)
			break;
		if (end > p->total)
			end = p->total;
		p->fn(p->args, (unsigned)begin, (unsigned)end);
	}
}

static void *pool_worker(void *arg)
{
	pool *p = arg;
	uint64_t seen = 0;

	for (;;) {
		pthread_mutex_lock(&p->mu);
		while (!p->stop && p->gen == seen)
			pthread_cond_wait(&p->go, &p->mu);
		if (p->stop) {
			pthread_mutex_unlock(&p->mu);
			return NULL;
		}
		seen = p->gen;
		pthread_mutex_unlock(&p->mu);
		pool_run_chunks(p);
		pthread_mutex_lock(&p->mu);
		if (--p->active == 0)
			pthread_cond_signal(&p->done);
		pthread_mutex_unlock(&p->mu);
	}
}

static pool *pool_free(pool *p)
{
	if (!p)
		return NULL;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->n_workers; i++)
		pthread_join(p->tids[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->go);
	pthread_cond_destroy(&p->done);
	free(p->tids);
	free(p);
	return NULL;
}

static pool *pool_new(int threads)
{
	pool *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	atomic_init(&p->next, 0);
	if (threads <= 1)
		return p;
	p->tids = calloc((size_t)threads - 1, sizeof(pthread_t));
	if (!p->tids)
		return pool_free(p);
	for (int i = 0; i < threads - 1; i++) {
		if (pthread_create(&p->tids[i], NULL, pool_worker, p) != 0)
			break;
		p->n_workers++;
	}
	return p;
}

/* Runs blocks [0, total) of `fn` on the calling thread and the workers. */
static void pool_launch(pool *p, host_kernel_fn fn, void *const *args, unsigned total)
{
	unsigned parts = (unsigned)p->n_workers + 1;

	if (total == 0)
		return;
	if (p->n_workers == 0 || total == 1) {
		fn(args, 0, total);
		return;
	}
	p->fn = fn;
	p->args = args;
	p->total = total;
	p->chunk = total / (parts * 4);
	if (p->chunk == 0)
		p->chunk = 1;
	atomic_store(&p->next, 0);
	pthread_mutex_lock(&p->mu);
	p->active = p->n_workers;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	pool_run_chunks(p);
	pthread_mutex_lock(&p->mu);
	while (p->active > 0)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
}

/* ---- GPU ------------------------------------------------------------------------- */

#define CU_SYM(api, name, sym)                                                       \
	do {                                                                         \
		void *s_ = dlsym((api)->lib, sym);                                   \
		if (!s_) {                                                           \
			missing = sym;                                               \
			goto fail;                                                   \
		}                                                                    \
		memcpy(&(api)->name, &s_, sizeof(s_));                               \
	} while (0)

/* Loads libcuda.so.1 into `api`.  false with the reason in `why`. */
static bool cuda_load(cuda_api *api, char *why, size_t cap)
{
	const char *missing = NULL;
	void *s;

	const char *path = getenv("APOLLO_LIBCUDA");

	if (!path || !*path)
		path = "libcuda.so.1";
	memset(api, 0, sizeof(*api));
	api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!api->lib) {
		const char *e = dlerror();
		if (why)
			snprintf(why, cap, "no CUDA driver: dlopen(%s) failed: %s", path,
				 e ? e : "not found");
		return false;
	}
	CU_SYM(api, cuInit, "cuInit");
	CU_SYM(api, cuDeviceGetCount, "cuDeviceGetCount");
	CU_SYM(api, cuDeviceGet, "cuDeviceGet");
	CU_SYM(api, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	s = dlsym(api->lib, "cuDevicePrimaryCtxRelease_v2");
	if (!s)
		s = dlsym(api->lib, "cuDevicePrimaryCtxRelease");
	if (!s) {
		missing = "cuDevicePrimaryCtxRelease";
		goto fail;
	}
	memcpy(&api->cuDevicePrimaryCtxRelease, &s, sizeof(s));
	CU_SYM(api, cuCtxSetCurrent, "cuCtxSetCurrent");
	CU_SYM(api, cuCtxSynchronize, "cuCtxSynchronize");
	CU_SYM(api, cuModuleLoadData, "cuModuleLoadData");
	CU_SYM(api, cuModuleUnload, "cuModuleUnload");
	CU_SYM(api, cuModuleGetFunction, "cuModuleGetFunction");
	CU_SYM(api, cuFuncSetAttribute, "cuFuncSetAttribute");
	CU_SYM(api, cuMemAlloc, "cuMemAlloc_v2");
	CU_SYM(api, cuMemFree, "cuMemFree_v2");
	CU_SYM(api, cuMemcpyHtoD, "cuMemcpyHtoD_v2");
	CU_SYM(api, cuMemcpyDtoH, "cuMemcpyDtoH_v2");
	CU_SYM(api, cuMemsetD8Async, "cuMemsetD8Async");
	CU_SYM(api, cuLaunchKernel, "cuLaunchKernel");
	CU_SYM(api, cuGetErrorString, "cuGetErrorString");
	{
		static const struct { size_t off; const char *sym; } opt[] = {
			{ offsetof(cuda_api, cuDeviceGetName), "cuDeviceGetName" },
			{ offsetof(cuda_api, cuDeviceGetAttribute), "cuDeviceGetAttribute" },
			{ offsetof(cuda_api, cuEventCreate), "cuEventCreate" },
			{ offsetof(cuda_api, cuEventDestroy), "cuEventDestroy_v2" },
			{ offsetof(cuda_api, cuEventRecord), "cuEventRecord" },
			{ offsetof(cuda_api, cuEventSynchronize), "cuEventSynchronize" },
			{ offsetof(cuda_api, cuEventElapsedTime), "cuEventElapsedTime" },
			{ offsetof(cuda_api, cuFuncGetAttribute), "cuFuncGetAttribute" },
			{ offsetof(cuda_api, cuStreamWaitEvent), "cuStreamWaitEvent" },
			{ offsetof(cuda_api, cuGetErrorName), "cuGetErrorName" },
			{ offsetof(cuda_api, cuDriverGetVersion), "cuDriverGetVersion" },
			{ offsetof(cuda_api, cuTensorMapEncodeTiled), "cuTensorMapEncodeTiled" },
		};

		for (size_t i = 0; i < sizeof(opt) / sizeof(opt[0]); i++) {
			s = dlsym(api->lib, opt[i].sym);
			memcpy((char *)api + opt[i].off, &s, sizeof(s));
		}
	}
	return true;
fail:
	if (why)
		snprintf(why, cap, "%s lacks %s", path, missing);
	dlclose(api->lib);
	api->lib = NULL;
	return false;
}

bool ap_runtime_cuda_available(char *why, size_t cap)
{
	cuda_api api;
	CUresult r;
	int n = 0;

	if (!cuda_load(&api, why, cap))
		return false;
	r = api.cuInit(0);
	if (r == 0)
		r = api.cuDeviceGetCount(&n);
	if (r != 0 || n <= 0) {
		if (why)
			snprintf(why, cap, "CUDA driver present but no usable device (%s)",
				 r != 0 ? cu_err(&api, r) : "0 devices");
		dlclose(api.lib);
		return false;
	}
	dlclose(api.lib);
	return true;
}

/* ---- GPU: the launch contract ------------------------------------------------------ */

/* What a kernel's blob is built for.  A cubin (an ELF, e_machine EM_CUDA
 * = 190) names its architecture in e_flags, in one of two layouts chosen
 * by e_ident[EI_ABIVERSION] (seen in NVRTC's cubins: CUDA 12.9 writes 7
 * for sm_50..sm_90a and 8 for sm_100 and later, CUDA 13.0 writes 8 for
 * all):
 *   7: the SM number in bits 0-7 (sm_80: 0x00500550, sm_90: 0x005a055a;
 *      0x800 marks sm_90a: 0x005a0d5a);
 *   8: the SM number in bits 8-15 (sm_80: 0x06005004, sm_90: 0x06005a04,
 *      sm_100: 0x06006402; 0x8 marks some "a" targets: sm_100a
 *      0x0600640a under 12.9 -- but CUDA 13.0 writes sm_90a as sm_90, so
 *      the kernel's target string is read for the "a" as well).
 * PTX names it in ".target sm_XY[a|f]".  Returns 1 with *sm (major * 10 +
 * minor), *suffix ('a', 'f' or 0) and *ptx set; 0 when the blob does not
 * say (left to the driver); AP_EINVAL for an ELF too short to be one. */
/* What a blob is, for a load failure: "PTX ISA 9.0 for .target sm_90" (its
 * .version and .target lines) or "a cubin of ELF ABI 8 (CUDA 13's NVRTC)
 * for sm_90" (ABI 7: CUDA 12's); "an unknown blob" otherwise. */
static void blob_what(const uint8_t *d, size_t n, char *buf, size_t cap)
{
	int sm = 0;

	if (n > 20 && !memcmp(d, "\177ELF", 4)) {
		unsigned abi = d[8];
		uint32_t flags;

		memcpy(&flags, d + 48, 4);   /* e_flags of a 64-bit ELF */
		sm = abi >= 8 ? (int)((flags >> 8) & 0xff) : (int)(flags & 0xff);
		snprintf(buf, cap, "a cubin of ELF ABI %u (CUDA %s's NVRTC) for sm_%d", abi,
			 abi >= 8 ? "13" : abi == 7 ? "12" : "11 or older", sm);
		return;
	}
	{
		const char *v = memmem(d, n, ".version ", 9), *t = memmem(d, n, ".target ", 8);
		int vl = 0, tl = 0;

		while (v && v + 9 + vl < (const char *)d + n && v[9 + vl] != '\n' && vl < 8)
			vl++;
		while (t && t + 8 + tl < (const char *)d + n && t[8 + tl] != '\n' && tl < 16)
			tl++;
		if (v)
			snprintf(buf, cap, "PTX ISA %.*s for .target %.*s", vl, v + 9, tl, t ? t + 8 : "?");
		else
			snprintf(buf, cap, "an unknown blob of %zu bytes", n);
	}
}

static int blob_arch(const uint8_t *d, size_t n, const char *target, const char *kname, int *sm,
		     char *suffix, bool *ptx, ap_error *err)
{
	size_t tl = target ? strlen(target) : 0;

	*suffix = tl && (target[tl - 1] == 'a' || target[tl - 1] == 'f') ? target[tl - 1] : 0;
	*ptx = false;
	if (n >= 4 && !memcmp(d, "\177ELF", 4)) {
		uint16_t machine;
		uint32_t flags;

		if (n < 64)
			return ap_error_set(err, AP_EINVAL, kname, NULL,
					    "kernel '%s': its cubin is a truncated ELF (%zu bytes)",
					    kname, n);
		memcpy(&machine, d + 18, 2);   /* e_machine */
		memcpy(&flags, d + 48, 4);     /* e_flags */
		if (d[4] != 2 || machine != 190)   /* ELFCLASS64, EM_CUDA */
			return 0;
		if (d[8] == 7) {
			*sm = (int)(flags & 0xff);
			if (flags & 0x800)
				*suffix = 'a';
		} else if (d[8] == 8) {
			*sm = (int)((flags >> 8) & 0xff);
			if (flags & 0x8)
				*suffix = 'a';
		} else {
			return 0;
		}
		return *sm > 0;
	}
	for (const uint8_t *p = d; (p = memmem(p, n - (size_t)(p - d), ".target", 7)) != NULL; p += 7) {
		const uint8_t *q = p + 7, *end = d + n;
		int v = 0;

		while (q < end && (*q == ' ' || *q == '\t'))
			q++;
		if (end - q < 4 || memcmp(q, "sm_", 3))
			continue;
		for (q += 3; q < end && *q >= '0' && *q <= '9' && v < 10000; q++)
			v = v * 10 + (*q - '0');
		*sm = v;
		*suffix = q < end && (*q == 'a' || *q == 'f') ? (char)*q : 0;
		*ptx = true;
		return v > 0;
	}
	return 0;
}

/* Whether code for `want` (suffix 'a': that architecture only; 'f': its
 * family, the same major) runs on a device of architecture `sm`.  A cubin
 * runs on its own major at the same or a later minor; PTX is compiled by
 * the driver for any later device (CUDA C++ Programming Guide, binary and
 * PTX compatibility). */
static bool arch_runs(int want, char suffix, bool ptx, int sm)
{
	if (suffix == 'a')
		return want == sm;
	if (suffix == 'f' || !ptx)
		return want / 10 == sm / 10 && want % 10 <= sm % 10;
	return want <= sm;
}

static int dev_attr(const cuda_api *cu, int attr, CUdevice d)
{
	int v = -1;

	if (!cu->cuDeviceGetAttribute || cu->cuDeviceGetAttribute(&v, attr, d) != 0)
		return -1;
	return v;
}

static void read_dev_facts(ap_runtime *rt)
{
	cu_dev_facts *f = &rt->dev_facts;
	const cuda_api *cu = &rt->cu;
	int major = dev_attr(cu, AP_CU_DEV_COMPUTE_CAPABILITY_MAJOR, rt->dev);
	int minor = dev_attr(cu, AP_CU_DEV_COMPUTE_CAPABILITY_MINOR, rt->dev);

	f->sm = major >= 0 && minor >= 0 ? major * 10 + minor : -1;
	f->max_threads = dev_attr(cu, AP_CU_DEV_MAX_THREADS_PER_BLOCK, rt->dev);
	for (int d = 0; d < 3; d++) {
		f->max_block[d] = dev_attr(cu, AP_CU_DEV_MAX_BLOCK_DIM_X + d, rt->dev);
		f->max_grid[d] = dev_attr(cu, AP_CU_DEV_MAX_GRID_DIM_X + d, rt->dev);
	}
	f->smem_optin = dev_attr(cu, AP_CU_DEV_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, rt->dev);
	f->cluster_launch = dev_attr(cu, AP_CU_DEV_CLUSTER_LAUNCH, rt->dev);
	snprintf(f->name, sizeof(f->name), "CUDA device");
	if (cu->cuDeviceGetName && cu->cuDeviceGetName(f->name, (int)sizeof(f->name), rt->dev) == 0)
		f->name[sizeof(f->name) - 1] = 0;
}

static int fn_attr(const cuda_api *cu, int attr, CUfunction fn)
{
	int v = -1;

	if (!cu->cuFuncGetAttribute || cu->cuFuncGetAttribute(&v, attr, fn) != 0)
		return -1;
	return v;
}

static void read_fn_facts(const cuda_api *cu, CUfunction fn, cu_fn_facts *f)
{
	f->max_threads = fn_attr(cu, AP_CU_FUNC_MAX_THREADS_PER_BLOCK, fn);
	f->static_smem = fn_attr(cu, AP_CU_FUNC_SHARED_SIZE_BYTES, fn);
	f->regs = fn_attr(cu, AP_CU_FUNC_NUM_REGS, fn);
	f->max_dyn_smem = fn_attr(cu, AP_CU_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn);
	for (int d = 0; d < 3; d++)
		f->cluster[d] = fn_attr(cu, AP_CU_FUNC_REQUIRED_CLUSTER_WIDTH + d, fn);
	f->cluster_must = fn_attr(cu, AP_CU_FUNC_CLUSTER_SIZE_MUST_BE_SET, fn);
	f->non_portable = fn_attr(cu, AP_CU_FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, fn);
}

/* Refuses kernel k's blob when the device cannot run its architecture. */
static int check_arch(const ap_runtime *rt, int device, const Apollo__Kernel *kk,
		      const ProtobufCBinaryData *blob, ap_error *err)
{
	const cu_dev_facts *dv = &rt->dev_facts;
	const char *target = kk->target && *kk->target ? kk->target : rt->b->target;
	int sm = 0, rc;
	char suffix;
	bool ptx;

	if ((rc = blob_arch(blob->data, blob->len, target, kk->name, &sm, &suffix, &ptx, err)) <= 0 ||
	    dv->sm < 0 || arch_runs(sm, suffix, ptx, dv->sm))
		return rc < 0 ? rc : 0;
	if (ptx)
		return ap_error_set(err, AP_EUNSUPPORTED, kk->name, NULL,
				    "kernel '%s' is PTX for .target sm_%d%.*s but device %d (%s) is "
				    "sm_%d: the driver compiles PTX only for its own or a later "
				    "architecture%s; compile the bundle for sm_%d",
				    kk->name, sm, suffix ? 1 : 0, &suffix, device, dv->name, dv->sm,
				    suffix == 'a' ? " (an 'a' target: only its own)" : "", dv->sm);
	return ap_error_set(err, AP_EUNSUPPORTED, kk->name, NULL,
			    "kernel '%s' is a cubin for sm_%d%.*s but device %d (%s) is sm_%d: a "
			    "cubin runs only on its own major architecture at the same or a later "
			    "minor%s; compile the bundle for sm_%d",
			    kk->name, sm, suffix ? 1 : 0, &suffix, device, dv->name, dv->sm,
			    suffix == 'a' ? " (an 'a' target: only its own)" : "", dv->sm);
}

/* The launch contract: launch l of the plan, of kernel k, against the
 * function's and the device's limits (see runtime.h).  Limits the driver
 * did not report (-1) are not checked. */
static int check_launch(const ap_runtime *rt, size_t l, const rt_kernel *k, ap_error *err)
{
	const Apollo__Kernel *kk = k->pb;
	const cu_fn_facts *f = &k->facts;
	const cu_dev_facts *dv = &rt->dev_facts;
	const uint32_t *g = kk->grid, *b = kk->block;
	unsigned long long threads = (unsigned long long)b[0] * b[1] * b[2];
	const char *n = kk->name;

	for (int d = 0; d < 3; d++)
		if (dv->max_block[d] >= 0 && b[d] > (unsigned)dv->max_block[d])
			return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
					    "kernel '%s' (launch %zu): block %ux%ux%u exceeds the "
					    "device's maximum block of %dx%dx%d", n, l, b[0], b[1], b[2],
					    dv->max_block[0], dv->max_block[1], dv->max_block[2]);
	if (dv->max_threads >= 0 && threads > (unsigned long long)dv->max_threads)
		return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
				    "kernel '%s' (launch %zu): block %ux%ux%u = %llu threads exceeds "
				    "the device's %d threads per block", n, l, b[0], b[1], b[2],
				    threads, dv->max_threads);
	if (f->max_threads >= 0 && threads > (unsigned long long)f->max_threads)
		return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
				    "kernel '%s' (launch %zu): block %ux%ux%u = %llu threads exceeds "
				    "the function's limit of %d threads per block (its .maxntid / "
				    "launch bounds, or %d registers per thread)", n, l, b[0], b[1],
				    b[2], threads, f->max_threads, f->regs);
	for (int d = 0; d < 3; d++)
		if (dv->max_grid[d] >= 0 && g[d] > (unsigned)dv->max_grid[d])
			return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
					    "kernel '%s' (launch %zu): grid %ux%ux%u exceeds the "
					    "device's maximum grid of %dx%dx%d", n, l, g[0], g[1], g[2],
					    dv->max_grid[0], dv->max_grid[1], dv->max_grid[2]);
	if (dv->smem_optin >= 0 &&
	    (unsigned long long)kk->dynamic_shared_bytes + (f->static_smem > 0 ? f->static_smem : 0) >
		    (unsigned long long)dv->smem_optin)
		return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
				    "kernel '%s' (launch %zu): %u bytes of dynamic + %d of static "
				    "shared memory exceed the device's opt-in limit of %d bytes per "
				    "block (sm_%d)", n, l, kk->dynamic_shared_bytes,
				    f->static_smem > 0 ? f->static_smem : 0, dv->smem_optin, dv->sm);
	if (f->cluster[0] > 0 || f->cluster[1] > 0 || f->cluster[2] > 0) {
		const int *c = f->cluster;
		int limit = f->non_portable == 1 ? AP_CLUSTER_NON_PORTABLE : AP_CLUSTER_PORTABLE;
		long long blocks = (long long)c[0] * c[1] * c[2];

		if (c[0] <= 0 || c[1] <= 0 || c[2] <= 0)
			return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
					    "kernel '%s' (launch %zu): its required cluster %dx%dx%d "
					    "is not all positive", n, l, c[0], c[1], c[2]);
		if (dv->cluster_launch == 0)
			return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
					    "kernel '%s' (launch %zu) needs thread-block clusters of "
					    "%dx%dx%d but the device (sm_%d) cannot launch clusters",
					    n, l, c[0], c[1], c[2], dv->sm);
		if (blocks > limit)
			return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
					    "kernel '%s' (launch %zu): its cluster %dx%dx%d of %lld "
					    "blocks exceeds the limit of %d (%s)", n, l, c[0], c[1], c[2],
					    blocks, limit,
					    limit == AP_CLUSTER_PORTABLE
						    ? "portable; 16 only where the function allows "
						      "non-portable sizes"
						    : "non-portable");
		for (int d = 0; d < 3; d++)
			if (g[d] % (unsigned)c[d])
				return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
						    "kernel '%s' (launch %zu): grid %ux%ux%u is not a "
						    "multiple of its required cluster %dx%dx%d", n, l,
						    g[0], g[1], g[2], c[0], c[1], c[2]);
	} else if (f->cluster_must == 1) {
		return ap_error_set(err, AP_EUNSUPPORTED, n, NULL,
				    "kernel '%s' (launch %zu) must be launched with a cluster size, "
				    "but it declares no cluster dims and the bundle carries none", n, l);
	}
	return 0;
}

static int gpu_setup(ap_runtime *rt, int device, ap_error *err)
{
	cuda_api *cu = &rt->cu;
	char why[256];
	CUresult r;
	int n = 0, rc;

	if (!cuda_load(cu, why, sizeof(why)))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "cannot run a %s bundle: %s", rt->b->target, why);
	if ((r = cu->cuInit(0)) != 0 || (r = cu->cuDeviceGetCount(&n)) != 0)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "cannot run a %s bundle: cuInit: %s", rt->b->target,
				    cu_err(cu, r));
	if (device < 0 || device >= n)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "cannot run a %s bundle: device %d of %d", rt->b->target,
				    device, n);
	if ((r = cu->cuDeviceGet(&rt->dev, device)) != 0 ||
	    (r = cu->cuDevicePrimaryCtxRetain(&rt->ctx, rt->dev)) != 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "CUDA context for device %d: %s",
				    device, cu_err(cu, r));
	rt->cu_ready = true;
	if ((r = cu->cuCtxSetCurrent(rt->ctx)) != 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cuCtxSetCurrent: %s", cu_err(cu, r));
	read_dev_facts(rt);

	/* Every blob's architecture first: nothing is loaded for a device that
	 * cannot run the bundle. */
	for (int k = 0; k < rt->n_kernels; k++)
		if (!rt->b->kernels[k]->blob_of &&
		    (rc = check_arch(rt, device, rt->b->kernels[k],
				     ap_bundle_pb_kernel_blob(rt->b, (size_t)k), err)) < 0)
			return rc;
	for (int k = 0; k < rt->n_kernels; k++) {
		const Apollo__Kernel *kk = rt->b->kernels[k];
		const ProtobufCBinaryData *blob = ap_bundle_pb_kernel_blob(rt->b, (size_t)k);
		rt_kernel *rk = &rt->kernels[k];
		/* Kernels sharing one blob share one module. */
		for (int j = 0; j < k && !rk->cumod; j++) {
			const ProtobufCBinaryData *o = ap_bundle_pb_kernel_blob(rt->b, (size_t)j);
			if (o->len == blob->len && (o->data == blob->data || !memcmp(o->data, blob->data, blob->len)))
				rk->cumod = rt->kernels[j].cumod;
		}
		if (!rk->cumod) {
			/* PTX must be NUL-terminated; a cubin does not mind. */
			uint8_t *img = malloc(blob->len + 1);
			if (!img)
				return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
			memcpy(img, blob->data, blob->len);
			img[blob->len] = 0;
			r = cu->cuModuleLoadData(&rk->cumod, img);
			free(img);
			if (r != 0) {
				char what[96], drv[48] = "a driver that does not say its CUDA version";
				int v = 0;

				rk->cumod = NULL;
				blob_what(blob->data, blob->len, what, sizeof(what));
				if (cu->cuDriverGetVersion && cu->cuDriverGetVersion(&v) == 0 && v > 0)
					snprintf(drv, sizeof(drv), "a CUDA %d.%d driver", v / 1000,
						 v % 1000 / 10);
				return ap_error_set(err, r == AP_CU_ERROR_NO_BINARY_FOR_GPU
							 ? AP_EUNSUPPORTED : AP_ECOMPILE,
						    kk->name, NULL,
						    "cuModuleLoadData for kernel '%s' (%s) on device %d (%s), "
						    "%s: %s", kk->name, what, device, rt->dev_facts.name, drv,
						    cu_err(cu, r));
			}
			rk->cumod_owner = true;
		}
		if ((r = cu->cuModuleGetFunction(&rk->cufn, rk->cumod, kk->name)) != 0)
			return ap_error_set(err, AP_ECOMPILE, kk->name, NULL,
					    "kernel '%s' not in its module: %s", kk->name,
					    cu_err(cu, r));
		read_fn_facts(cu, rk->cufn, &rk->facts);
	}
	/* The launch contract, before anything runs. */
	for (size_t l = 0; l < rt->b->n_plan; l++)
		if ((rc = check_launch(rt, l, &rt->kernels[rt->b->plan[l]->kernel], err)) < 0)
			return rc;
	/* Dynamic shared memory beyond the function's default limit (48 KiB
	 * less its static shared memory) is asked for explicitly. */
	for (int k = 0; k < rt->n_kernels; k++) {
		const Apollo__Kernel *kk = rt->b->kernels[k];
		const rt_kernel *rk = &rt->kernels[k];
		long limit = rk->facts.max_dyn_smem >= 0 ? rk->facts.max_dyn_smem : 48 * 1024;

		if (kk->dynamic_shared_bytes > limit &&
		    (r = cu->cuFuncSetAttribute(rk->cufn, AP_CU_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES,
						(int)kk->dynamic_shared_bytes)) != 0)
			return ap_error_set(err, AP_EUNSUPPORTED, kk->name, NULL,
					    "kernel '%s' asks for %u bytes of dynamic shared memory: %s",
					    kk->name, kk->dynamic_shared_bytes, cu_err(cu, r));
	}

	/* Buffers: one allocation each; intermediates inside a workspace, the
	 * first one made here (zeroed on the stream of the run that takes it). */
	{
		uint64_t ws = rt->b->workspace_bytes ? rt->b->workspace_bytes : 256;
		if ((r = cu->cuMemAlloc(&rt->ws[0].dev, (size_t)ws)) != 0) {
			rt->ws[0].dev = 0;
			return ap_error_set(err, AP_ENOMEM, NULL, NULL,
					    "cuMemAlloc of a %llu-byte workspace: %s",
					    (unsigned long long)ws, cu_err(cu, r));
		}
		rt->n_ws = 1;
	}
	for (int i = 0; i < rt->n_buffers; i++) {
		rt_buffer *bf = &rt->buffers[i];
		if (bf->pb->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE) {
			bf->has_storage = true;   /* in the run's workspace */
			continue;
		}
		if (!rt->external && own_storage(rt, bf, err) < 0)
			return err ? err->code : AP_ENOMEM;
	}
	/* Library launches: cuBLASLt once for the runtime; without it each
	 * runs its own kernel (Launch.kernel), said once per process. */
	if (rt->lib_launches) {
		rt->lib_plans = calloc(rt->b->n_plan, sizeof(*rt->lib_plans));
		if (!rt->lib_plans)
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		rt->lt = ap_cublaslt_open(rt->lib_why, sizeof(rt->lib_why));
		if (!rt->lt) {
			static atomic_int said;

			rt->lib_fallbacks = rt->lib_launches;
			if (!atomic_exchange(&said, 1))
				fprintf(stderr, "apollo: %s; the bundle's %d library launch%s run%s "
					"Apollo's own kernel%s instead\n", rt->lib_why,
					rt->lib_launches, rt->lib_launches == 1 ? "" : "es",
					rt->lib_launches == 1 ? "s" : "", rt->lib_launches == 1 ? "" : "s");
		}
	}
	return 0;
}

/* Gives buffer bf zeroed storage of its own (host or device), unless it has
 * its own already; storage the caller bound is forgotten, not freed.  On a
 * GPU the zeroing is queued on the stream of the next run (run_gpu), in
 * order with its launches, unless a copy fills the buffer first. */
static int own_storage(ap_runtime *rt, rt_buffer *bf, ap_error *err)
{
	if (rt->host ? bf->host_owned : bf->dev_owned)
		return 0;
	bf->has_storage = false;
	if (rt->host) {
		bf->host = host_alloc(bf->pb->bytes);
		if (!bf->host)
			return ap_error_set(err, AP_ENOMEM, NULL, bf->pb->name,
					    "out of memory for buffer '%s' (%llu bytes)",
					    bf->pb->name, (unsigned long long)bf->pb->bytes);
		bf->host_owned = true;
	} else {
		cuda_api *cu = &rt->cu;
		uint64_t n = bf->pb->bytes ? bf->pb->bytes : 256;
		CUresult r;

		cu->cuCtxSetCurrent(rt->ctx);
		if ((r = cu->cuMemAlloc(&bf->dev, (size_t)n)) != 0) {
			bf->dev = 0;
			return ap_error_set(err, AP_ENOMEM, NULL, bf->pb->name,
					    "cuMemAlloc for buffer '%s' (%llu bytes): %s",
					    bf->pb->name, (unsigned long long)n, cu_err(cu, r));
		}
		bf->dev_owned = true;
		bf->zero_pending = true;
	}
	bf->has_storage = true;
	return 0;
}

/* Frees the buffer's own storage, if any (the caller's is left alone). */
static void drop_storage(ap_runtime *rt, rt_buffer *bf)
{
	if (bf->host_owned)
		free(bf->host);
	if (bf->dev_owned && rt->cu_ready)
		rt->cu.cuMemFree(bf->dev);
	bf->host = NULL;
	bf->dev = 0;
	bf->host_owned = bf->dev_owned = false;
	bf->zero_pending = false;
	bf->has_storage = false;
}

static void gpu_teardown(ap_runtime *rt)
{
	cuda_api *cu = &rt->cu;

	if (!cu->lib)
		return;
	if (rt->cu_ready) {
		cu->cuCtxSetCurrent(rt->ctx);
		ap_cublaslt_close(rt->lt);
		rt->lt = NULL;
		for (int e = 0; e < 2; e++)
			if (rt->ev[e])
				cu->cuEventDestroy(rt->ev[e]);
		for (int i = 0; rt->buffers && i < rt->n_buffers; i++)
			if (rt->buffers[i].dev_owned)
				cu->cuMemFree(rt->buffers[i].dev);
		for (int w = 0; w < rt->n_ws; w++)
			cu->cuMemFree(rt->ws[w].dev);
		if (rt->copy_ev)
			cu->cuEventDestroy(rt->copy_ev);
		for (int k = 0; rt->kernels && k < rt->n_kernels; k++)
			if (rt->kernels[k].cumod_owner)
				cu->cuModuleUnload(rt->kernels[k].cumod);
		cu->cuDevicePrimaryCtxRelease(rt->dev);
	}
	dlclose(cu->lib);
	cu->lib = NULL;
}

/* ---- public ------------------------------------------------------------------------- */

ap_runtime *ap_runtime_free(ap_runtime *rt)
{
	if (!rt)
		return NULL;
	rt->pool = pool_free(rt->pool);
	if (rt->host) {
		for (int i = 0; rt->buffers && i < rt->n_buffers; i++)
			if (rt->buffers[i].host_owned)
				free(rt->buffers[i].host);
		free(rt->workspace);
		for (int i = 0; i < rt->n_libs; i++) {
			dlclose(rt->libs[i]);
			if (rt->lib_fds[i] >= 0)
				close(rt->lib_fds[i]);
		}
	} else {
		gpu_teardown(rt);
	}
	free(rt->libs);
	free(rt->lib_fds);
	free(rt->lib_plans);
	free(rt->argv);
	free(rt->launch_ms);
	free(rt->map_cache);
	free(rt->map_addr);
	free(rt->map_first);
	for (int k = 0; rt->kernels && k < rt->n_kernels; k++) {
		free(rt->kernels[k].tmap);
		free(rt->kernels[k].tmap_param);
	}
	free(rt->kernels);
	free(rt->buffers);
	free(rt);
	return NULL;
}

static int bind(ap_runtime *rt, rt_buffer *bf, const ap_host_tensor *t, ap_error *err);

ap_runtime *ap_runtime_new(const ap_bundle *bundle, const ap_runtime_options *opt, ap_error *err)
{
	const Apollo__Bundle *b = ap_bundle_pb(bundle);
	const char *target = b->target ? b->target : "";
	ap_runtime *rt;
	int threads = opt ? opt->threads : 0;

	if (ap_runtime_check(bundle, err) < 0)
		return NULL;
	if (strcmp(target, "cpu") != 0 && strncmp(target, "host:", 5) != 0 &&
	    !is_gpu_target(target)) {
		ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
			     "cannot run a bundle for target '%s' (cpu, sm_XX, compute_XX)", target);
		return NULL;
	}
	rt = calloc(1, sizeof(*rt));
	if (!rt) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		return NULL;
	}
	rt->b = b;
	rt->host = strcmp(target, "cpu") == 0 || strncmp(target, "host:", 5) == 0;
	rt->external = opt && opt->external;
	rt->n_kernels = (int)b->n_kernels;
	rt->n_buffers = (int)b->n_buffers;
	rt->kernels = calloc(b->n_kernels ? b->n_kernels : 1, sizeof(rt_kernel));
	rt->buffers = calloc(b->n_buffers ? b->n_buffers : 1, sizeof(rt_buffer));
	if (opt && opt->profile)
		rt->launch_ms = calloc(b->n_plan ? b->n_plan : 1, sizeof(double));
	if (!rt->kernels || !rt->buffers || (opt && opt->profile && !rt->launch_ms)) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		return ap_runtime_free(rt);
	}
	for (int k = 0; k < rt->n_kernels; k++) {
		const Apollo__Kernel *kk = b->kernels[k];
		rt->kernels[k].pb = kk;
		rt->kernels[k].blocks = (unsigned long long)kk->grid[0] * kk->grid[1] * kk->grid[2];
		int maps = 0;

		for (size_t p = 0; p < kk->n_params; p++)
			maps += kk->params[p]->tmap != NULL;
		rt->kernels[k].n_tmaps = maps;
		if (maps && parse_tmaps(&rt->kernels[k], err) < 0)
			return ap_runtime_free(rt);
		rt->n_tmaps = maps > rt->n_tmaps ? maps : rt->n_tmaps;
		if ((int)kk->n_params > rt->max_args)
			rt->max_args = (int)kk->n_params;
	}
	for (int i = 0; i < rt->n_buffers; i++) {
		const Apollo__Buffer *bf = b->buffers[i];
		rt->buffers[i].pb = bf;
		if (bf->kind == APOLLO__BUFFER_KIND__BUF_INPUT)
			rt->n_inputs = bf->index + 1 > rt->n_inputs ? bf->index + 1 : rt->n_inputs;
		if (bf->kind == APOLLO__BUFFER_KIND__BUF_OUTPUT)
			rt->n_outputs++;
	}
	for (size_t l = 0; l < b->n_plan; l++)
		rt->lib_launches += b->plan[l]->library != NULL;
	if (rt->host) {
		if (threads <= 0) {
			long n = sysconf(_SC_NPROCESSORS_ONLN);
			threads = n <= 0 ? 1 : n > 8 ? 8 : (int)n;
		}
		if (host_load(rt, err) < 0 || host_alloc_all(rt, err) < 0)
			return ap_runtime_free(rt);
		rt->pool = pool_new(threads);
		if (!rt->pool) {
			ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
			return ap_runtime_free(rt);
		}
	} else {
		if (gpu_setup(rt, opt ? opt->device : 0, err) < 0)
			return ap_runtime_free(rt);
		if (rt->n_tmaps && !rt->cu.cuTensorMapEncodeTiled) {
			ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				     "the bundle's TMA kernels need cuTensorMapEncodeTiled, which this CUDA "
				     "driver lacks (CUDA 12 or later)");
			return ap_runtime_free(rt);
		}
		if (rt->n_tmaps && map_cache_new(rt, err) < 0)
			return ap_runtime_free(rt);
	}
	/* the bundle's constants: bound here, once, whatever the client */
	for (int i = 0; i < rt->n_buffers; i++) {
		rt_buffer *bf = &rt->buffers[i];
		ap_host_tensor t;

		if (bf->pb->kind != APOLLO__BUFFER_KIND__BUF_CONST)
			continue;
		memset(&t, 0, sizeof(t));
		t.name = bf->pb->name;
		t.dtype = (ap_dtype)bf->pb->dtype;
		t.data = bf->pb->data.data;
		t.nbytes = bf->pb->data.len;
		if (bind(rt, bf, &t, err) < 0)
			return ap_runtime_free(rt);
	}
	return rt;
}

bool ap_runtime_is_host(const ap_runtime *rt) { return rt->host; }

int ap_runtime_library(const ap_runtime *rt, int *fallbacks, char *why, size_t cap)
{
	if (fallbacks)
		*fallbacks = rt->host ? rt->lib_launches : rt->lib_fallbacks;
	if (why && cap)
		snprintf(why, cap, "%s", rt->host && rt->lib_launches ? "the host target runs Apollo's kernels"
					 : rt->lib_why);
	return rt->lib_launches;
}
int ap_runtime_n_inputs(const ap_runtime *rt) { return rt->n_inputs; }
int ap_runtime_n_outputs(const ap_runtime *rt) { return rt->n_outputs; }

static int bind(ap_runtime *rt, rt_buffer *bf, const ap_host_tensor *t, ap_error *err)
{
	const Apollo__Buffer *pb = bf->pb;
	const char *what = pb->kind == APOLLO__BUFFER_KIND__BUF_INPUT ? "input"
			   : pb->kind == APOLLO__BUFFER_KIND__BUF_CONST ? "constant" : "param";

	if ((int)t->dtype != (int)pb->dtype)
		return ap_error_set(err, AP_ESHAPE, NULL, pb->name,
				    "%s '%s' is %s but the data given is %s", what, pb->name,
				    ap_dtype_name((ap_dtype)pb->dtype), ap_dtype_name(t->dtype));
	if (t->nbytes != pb->bytes)
		return ap_error_set(err, AP_ESHAPE, NULL, pb->name,
				    "%s '%s' holds %llu bytes but the data given has %zu", what,
				    pb->name, (unsigned long long)pb->bytes, t->nbytes);
	if (own_storage(rt, bf, err) < 0)
		return err ? err->code : AP_ENOMEM;
	if (rt->host) {
		if (t->nbytes)
			memcpy(bf->host, t->data, t->nbytes);
	} else if (t->nbytes) {
		CUresult r;
		rt->cu.cuCtxSetCurrent(rt->ctx);
		r = rt->cu.cuMemcpyHtoD(bf->dev, t->data, t->nbytes);
		if (r != 0)
			return ap_error_set(err, AP_EIO, NULL, pb->name,
					    "copying %s '%s' to the device: %s", what, pb->name,
					    cu_err(&rt->cu, r));
		/* every byte written: no zeroing; a run on another stream than
		 * the legacy one waits for the copy (run_gpu) */
		bf->zero_pending = false;
		rt->legacy_pending = true;
	}
	bf->bound = true;
	return 0;
}

int ap_runtime_bind_input(ap_runtime *rt, int index, const ap_host_tensor *t, ap_error *err)
{
	for (int i = 0; i < rt->n_buffers; i++) {
		const Apollo__Buffer *pb = rt->buffers[i].pb;
		if (pb->kind == APOLLO__BUFFER_KIND__BUF_INPUT && pb->index == index)
			return bind(rt, &rt->buffers[i], t, err);
	}
	return ap_error_set(err, AP_EINVAL, NULL, NULL, "the bundle has no input %d", index);
}

int ap_runtime_bind_name(ap_runtime *rt, const char *name, const ap_host_tensor *t,
			 ap_error *err)
{
	for (int i = 0; i < rt->n_buffers; i++) {
		const Apollo__Buffer *pb = rt->buffers[i].pb;
		if ((pb->kind == APOLLO__BUFFER_KIND__BUF_INPUT ||
		     pb->kind == APOLLO__BUFFER_KIND__BUF_PARAM) &&
		    !strcmp(pb->name, name))
			return bind(rt, &rt->buffers[i], t, err);
	}
	return ap_error_set(err, AP_EINVAL, NULL, name,
			    "the bundle has no input or param named '%s'", name);
}

int ap_runtime_bind_params(ap_runtime *rt, const ap_params *params, ap_error *err)
{
	for (int i = 0; i < rt->n_buffers; i++) {
		rt_buffer *bf = &rt->buffers[i];
		const ap_host_tensor *t;
		int rc;
		if (bf->pb->kind != APOLLO__BUFFER_KIND__BUF_PARAM)
			continue;
		t = params ? ap_params_find(params, bf->pb->name) : NULL;
		if (!t && bf->bound)
			continue;
		if (!t)
			return ap_error_set(err, AP_EINVAL, NULL, bf->pb->name,
					    "no data for param '%s'", bf->pb->name);
		if ((rc = bind(rt, bf, t, err)) < 0)
			return rc;
	}
	return 0;
}

int ap_runtime_bind_zeros(ap_runtime *rt, ap_error *err)
{
	for (int i = 0; i < rt->n_buffers; i++) {
		rt_buffer *bf = &rt->buffers[i];

		if ((bf->pb->kind != APOLLO__BUFFER_KIND__BUF_INPUT &&
		     bf->pb->kind != APOLLO__BUFFER_KIND__BUF_PARAM) || bf->bound)
			continue;
		/* own storage starts zeroed and was never written: nothing bound it */
		if (own_storage(rt, bf, err) < 0)
			return err ? err->code : AP_ENOMEM;
		bf->bound = true;
	}
	return 0;
}

int ap_runtime_device(const ap_runtime *rt, char *name, size_t cap, unsigned *sms,
		      ap_error *err)
{
	const cuda_api *cu = &rt->cu;
	int n = 0;
	CUresult r;

	if (rt->host)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "target %s runs on the host, not on a GPU", rt->b->target);
	if (!cu->cuDeviceGetName || !cu->cuDeviceGetAttribute)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "the CUDA driver lacks cuDeviceGetName or cuDeviceGetAttribute");
	if (cap > INT32_MAX)
		cap = INT32_MAX;
	if ((r = cu->cuDeviceGetName(name, (int)cap, rt->dev)) != 0 ||
	    (r = cu->cuDeviceGetAttribute(&n, AP_CU_DEV_MULTIPROCESSOR_COUNT,
					  rt->dev)) != 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "device facts: %s", cu_err(cu, r));
	if (cap)
		name[cap - 1] = 0;
	*sms = n > 0 ? (unsigned)n : 0;
	return 0;
}

int ap_runtime_bind_consts(ap_runtime *rt, const ap_graph *g, ap_error *err)
{
	for (int i = 0; i < rt->n_buffers; i++) {
		rt_buffer *bf = &rt->buffers[i];
		ap_host_tensor t;
		const ap_tensor *gt;
		int ti, rc;
		if (bf->pb->kind != APOLLO__BUFFER_KIND__BUF_PARAM || bf->bound)
			continue;
		ti = ap_graph_find_tensor(g, bf->pb->name);
		if (ti < 0 || g->tensors[ti].kind != AP_TENSOR_CONST)
			continue;
		gt = &g->tensors[ti];
		memset(&t, 0, sizeof(t));
		t.name = gt->name;
		t.dtype = gt->dtype;
		t.rank = gt->rank;
		memcpy(t.dims, gt->dims, sizeof(t.dims));
		t.data = gt->data;
		t.nbytes = gt->nbytes;
		if ((rc = bind(rt, bf, &t, err)) < 0)
			return rc;
	}
	return 0;
}

static int check_bound(ap_runtime *rt, ap_error *err)
{
	for (int i = 0; i < rt->n_buffers; i++) {
		const rt_buffer *bf = &rt->buffers[i];
		if (bf->bound)
			continue;
		if (bf->pb->kind == APOLLO__BUFFER_KIND__BUF_INPUT)
			return ap_error_set(err, AP_EINVAL, NULL, bf->pb->name,
					    "input %d '%s' is not bound", (int)bf->pb->index,
					    bf->pb->name);
		if (bf->pb->kind == APOLLO__BUFFER_KIND__BUF_PARAM)
			return ap_error_set(err, AP_EINVAL, NULL, bf->pb->name,
					    "param '%s' is not bound", bf->pb->name);
	}
	return 0;
}

/* The workspace of runs on `stream`.  One runtime has one workspace per
 * stream it ran on, not one for all: runs queued on two streams may
 * execute at the same time, and with one workspace each would overwrite
 * the other's intermediates -- silently, and only when the timing says
 * so.  Refusing a run on a second stream while another may still execute
 * could not be decided without waiting for the device (the error would
 * come and go with the timing), and making the second stream wait for the
 * first would hide the caller's concurrency; the memory is the price: the
 * workspace once per stream (AP_RT_MAX_STREAMS at most; a run on one more
 * stream is refused, AP_EBUSY).  The first run's stream takes the
 * workspace ap_runtime_new made; each is zeroed on its stream before the
 * first launch there (run_prologue). */
static int stream_workspace(ap_runtime *rt, CUstream stream, struct rt_ws **out, ap_error *err)
{
	uint64_t bytes = rt->b->workspace_bytes ? rt->b->workspace_bytes : 256;
	struct rt_ws *w = NULL;
	CUresult r;

	for (int i = 0; i < rt->n_ws && !w; i++)
		if (rt->ws[i].taken && rt->ws[i].stream == stream)
			w = &rt->ws[i];
	for (int i = 0; i < rt->n_ws && !w; i++)
		if (!rt->ws[i].taken)
			w = &rt->ws[i];
	if (!w) {
		if (rt->n_ws == AP_RT_MAX_STREAMS)
			return ap_error_set(err, AP_EBUSY, NULL, NULL,
					    "this runtime already keeps a workspace for each of %d "
					    "streams; runs on another stream (%p) would need one more: "
					    "run on one of those streams, or make another runtime",
					    AP_RT_MAX_STREAMS, stream);
		w = &rt->ws[rt->n_ws];
		memset(w, 0, sizeof(*w));
		if ((r = rt->cu.cuMemAlloc(&w->dev, (size_t)bytes)) != 0)
			return ap_error_set(err, AP_ENOMEM, NULL, NULL,
					    "cuMemAlloc of a %llu-byte workspace for stream %p: %s",
					    (unsigned long long)bytes, stream, cu_err(&rt->cu, r));
		rt->n_ws++;
	}
	if (!w->taken) {
		w->taken = true;
		w->stream = stream;
	}
	*out = w;
	return 0;
}

/* Everything the run issues before its launches, on its stream: the wait
 * for copies queued on the legacy stream (binding by copy) when the run is
 * on another one (an event recorded there, waited for here), and the
 * zeroing of its workspace and of the buffers the runtime allocated that
 * nothing wrote yet. */
static int run_prologue(ap_runtime *rt, CUstream stream, struct rt_ws *ws, ap_error *err)
{
	cuda_api *cu = &rt->cu;
	CUresult r = 0;

	if (stream && rt->legacy_pending) {
		if (cu->cuEventCreate && cu->cuEventRecord && cu->cuStreamWaitEvent &&
		    cu->cuEventDestroy) {
			if (!rt->copy_ev &&
			    (r = cu->cuEventCreate(&rt->copy_ev, AP_CU_EVENT_DISABLE_TIMING)) != 0)
				rt->copy_ev = NULL;
			if (r == 0 && (r = cu->cuEventRecord(rt->copy_ev, NULL)) == 0)
				r = cu->cuStreamWaitEvent(stream, rt->copy_ev, 0);
		} else {
			r = cu->cuCtxSynchronize();
		}
		if (r != 0)
			return ap_error_set(err, AP_EIO, NULL, NULL,
					    "ordering the bound data's copies before the run: %s",
					    cu_err(cu, r));
		rt->legacy_pending = false;
	}
	if (!ws->zeroed) {
		uint64_t bytes = rt->b->workspace_bytes ? rt->b->workspace_bytes : 256;

		if ((r = cu->cuMemsetD8Async(ws->dev, 0, (size_t)bytes, stream)) != 0)
			return ap_error_set(err, AP_EIO, NULL, NULL, "zeroing the workspace: %s",
					    cu_err(cu, r));
		ws->zeroed = true;
	}
	for (int i = 0; i < rt->n_buffers; i++) {
		rt_buffer *bf = &rt->buffers[i];

		if (!bf->zero_pending)
			continue;
		r = cu->cuMemsetD8Async(bf->dev, 0, bf->pb->bytes ? (size_t)bf->pb->bytes : 256, stream);
		if (r != 0)
			return ap_error_set(err, AP_EIO, NULL, bf->pb->name, "zeroing buffer '%s': %s",
					    bf->pb->name, cu_err(cu, r));
		bf->zero_pending = false;
	}
	return 0;
}

/* The plan's map cache (rt->map_cache): a slot per tensor map of each
 * launch, none encoded yet.  0 or AP_ENOMEM. */
static int map_cache_new(ap_runtime *rt, ap_error *err)
{
	size_t n = 0;

	rt->map_first = calloc(rt->b->n_plan ? rt->b->n_plan : 1, sizeof(size_t));
	if (!rt->map_first)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (size_t l = 0; l < rt->b->n_plan; l++) {
		rt->map_first[l] = n;
		n += (size_t)rt->kernels[rt->b->plan[l]->kernel].n_tmaps;
	}
	rt->map_cache = aligned_alloc(64, (n ? n : 1) * sizeof(rt_tmap));
	rt->map_addr = calloc(n ? n : 1, sizeof(CUdeviceptr));
	if (!rt->map_cache || !rt->map_addr)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	return 0;
}

/* The tensor maps of launch l's kernel k (vals: its params' device
 * addresses), their addresses into pp (the kernel's parameters after the
 * pointers, in param order): each from the cache when its buffer's
 * address is the one it was encoded for, else encoded by the driver
 * again (an address changes with ap_runtime_bind_ptr or with the
 * stream's workspace).  0 or AP_EIO with the driver's error. */
static int encode_tmaps(ap_runtime *rt, size_t l, const rt_kernel *k, const CUdeviceptr *vals, void **pp,
			ap_error *err)
{
	for (int m = 0; m < k->n_tmaps; m++) {
		const ap_tmap_desc *d = &k->tmap[m];
		size_t a = k->tmap_param[m], at = rt->map_first[l] + (size_t)m;

		if (rt->map_addr[at] != vals[a]) {
			CUresult r = rt->cu.cuTensorMapEncodeTiled(&rt->map_cache[at], d->dtype, (unsigned)d->rank,
								   (void *)(uintptr_t)vals[a], d->dims, d->strides,
								   d->box, d->estrides, d->interleave, d->swizzle,
								   d->l2, d->oob);

			if (r != 0) {
				rt->map_addr[at] = 0;
				return ap_error_set(err, AP_EIO, k->pb->name, NULL,
						    "kernel '%s': cuTensorMapEncodeTiled for param %zu failed: %s",
						    k->pb->name, a, cu_err(&rt->cu, r));
			}
			rt->map_addr[at] = vals[a];
		}
		pp[m] = &rt->map_cache[at];
	}
	return 0;
}

/* Queues the plan on `stream`; with no stream (NULL) waits for it, so that
 * an error a kernel raises on the device is reported by the run that
 * launched it. */

static int run_gpu(ap_runtime *rt, CUstream stream, ap_error *err)
{
	cuda_api *cu = &rt->cu;
	CUdeviceptr *vals = calloc(rt->max_args ? (size_t)rt->max_args : 1, sizeof(CUdeviceptr));
	void **pp = calloc((size_t)rt->max_args + (size_t)rt->n_tmaps + 1, sizeof(void *));
	struct rt_ws *ws = NULL;
	CUresult r;
	int rc = 0, fallbacks = 0;

	if (!vals || !pp) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto out;
	}
	cu->cuCtxSetCurrent(rt->ctx);
	if ((rc = stream_workspace(rt, stream, &ws, err)) < 0 ||
	    (rc = run_prologue(rt, stream, ws, err)) < 0)
		goto out;
	if (rt->launch_ms && !rt->ev[0] && cu->cuEventCreate && cu->cuEventRecord &&
	    cu->cuEventSynchronize && cu->cuEventElapsedTime && cu->cuEventDestroy &&
	    (cu->cuEventCreate(&rt->ev[0], 0) != 0 || cu->cuEventCreate(&rt->ev[1], 0) != 0)) {
		if (rt->ev[0])
			cu->cuEventDestroy(rt->ev[0]);
		rt->ev[0] = rt->ev[1] = NULL;   /* the host clock, then */
	}
	for (size_t l = 0; l < rt->b->n_plan; l++) {
		const Apollo__Launch *la = rt->b->plan[l];
		const rt_kernel *k = &rt->kernels[la->kernel];
		const Apollo__Kernel *kk = k->pb;
		for (size_t a = 0; a < la->n_args; a++) {
			const rt_buffer *bf = &rt->buffers[la->args[a]];

			vals[a] = bf->pb->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE
					  ? ws->dev + bf->pb->offset : bf->dev;
			pp[a] = &vals[a];
		}
		if (k->n_tmaps && (rc = encode_tmaps(rt, l, k, vals, pp + la->n_args, err)) < 0)
			goto out;
		double t0 = rt->launch_ms ? ap_now_ms() : 0;
		bool events = rt->launch_ms && rt->ev[1];

		bool own = true;

		r = events ? cu->cuEventRecord(rt->ev[0], stream) : 0;
		if (r == 0 && la->library && rt->lt) {
			ap_error lerr;

			rc = ap_cublaslt_matmul(rt->lt, &rt->lib_plans[l], la->library, vals, ws->dev,
						stream, kk->name, &lerr);
			if (rc == 0) {
				own = false;
			} else if (rc == AP_EUNSUPPORTED) {
				/* the library refused this product: our kernel, said once */
				rc = 0;
				if (!rt->lib_why[0]) {
					snprintf(rt->lib_why, sizeof(rt->lib_why), "%s", lerr.msg);
					fprintf(stderr, "apollo: %s; running Apollo's kernel instead\n",
						lerr.msg);
				}
			} else {
				if (err)
					*err = lerr;
				goto out;
			}
		}
		if (own && la->library)
			fallbacks++;
		if (r == 0 && own)
			r = cu->cuLaunchKernel(k->cufn, kk->grid[0], kk->grid[1], kk->grid[2],
					       kk->block[0], kk->block[1], kk->block[2],
					       kk->dynamic_shared_bytes, stream, pp, NULL);
		if (r == 0 && events) {
			/* the device's own clock: launch overhead left out */
			float ms = 0;

			if ((r = cu->cuEventRecord(rt->ev[1], stream)) == 0 &&
			    (r = cu->cuEventSynchronize(rt->ev[1])) == 0 &&
			    (r = cu->cuEventElapsedTime(&ms, rt->ev[0], rt->ev[1])) == 0)
				rt->launch_ms[l] += ms;
		} else if (r == 0 && rt->launch_ms && (r = cu->cuCtxSynchronize()) == 0) {
			rt->launch_ms[l] += ap_now_ms() - t0;
		}
		if (r != 0) {
			rc = ap_error_set(err, AP_EIO, kk->name, NULL,
					  "launch %zu of kernel '%s' failed: %s", l, kk->name,
					  cu_err(cu, r));
			goto out;
		}
	}
	if (!stream) {
		if ((r = cu->cuCtxSynchronize()) != 0)
			rc = ap_error_set(err, AP_EIO, NULL, NULL,
					  "running the plan failed on the device: %s (reported "
					  "when waiting for its %zu launches: any of them may have "
					  "raised it; with profiling on each launch is waited for "
					  "and named)", cu_err(cu, r), rt->b->n_plan);
		else
			rt->legacy_pending = false;   /* the copies are done */
	}
	rt->lib_fallbacks = fallbacks;
out:
	free(vals);
	free(pp);
	return rc;
}

int ap_runtime_bind_ptr(ap_runtime *rt, int buffer, void *ptr, uint64_t bytes, ap_error *err)
{
	rt_buffer *bf;
	const Apollo__Buffer *pb;

	if (buffer < 0 || buffer >= rt->n_buffers)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "the bundle has no buffer %d", buffer);
	bf = &rt->buffers[buffer];
	pb = bf->pb;
	if (pb->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE)
		return ap_error_set(err, AP_EINVAL, NULL, pb->name,
				    "buffer '%s' is an intermediate: it lives in the workspace",
				    pb->name);
	if (pb->kind == APOLLO__BUFFER_KIND__BUF_CONST)
		return ap_error_set(err, AP_EINVAL, NULL, pb->name,
				    "buffer '%s' is a constant: the runtime binds it from the bundle",
				    pb->name);
	if (bytes != pb->bytes)
		return ap_error_set(err, AP_ESHAPE, NULL, pb->name,
				    "buffer '%s' holds %llu bytes but the memory given has %llu",
				    pb->name, (unsigned long long)pb->bytes,
				    (unsigned long long)bytes);
	if (!ptr && bytes > 0)
		return ap_error_set(err, AP_EINVAL, NULL, pb->name,
				    "buffer '%s': NULL memory for %llu bytes", pb->name,
				    (unsigned long long)bytes);
	if ((uintptr_t)ptr % 16 != 0)
		return ap_error_set(err, AP_EINVAL, NULL, pb->name,
				    "buffer '%s': memory at %p is not 16-byte aligned", pb->name, ptr);
	drop_storage(rt, bf);
	if (rt->host)
		bf->host = ptr;
	else
		bf->dev = (CUdeviceptr)(uintptr_t)ptr;
	bf->has_storage = true;
	bf->bound = true;
	return 0;
}

/* Outputs nobody bound get storage of their own before a run. */
static int outputs_ready(ap_runtime *rt, ap_error *err)
{
	for (int i = 0; i < rt->n_buffers; i++) {
		rt_buffer *bf = &rt->buffers[i];

		if (!bf->has_storage && own_storage(rt, bf, err) < 0)
			return err ? err->code : AP_ENOMEM;
	}
	return 0;
}

/* A launch of a checked bundle: the buffers' extents to the checker, the
 * launch, then what the checker found (hostcheck.h): a violation fails the
 * run with the kernel and the first findings. */
static int launch_checked(ap_runtime *rt, const Apollo__Launch *la, const rt_kernel *k,
			  ap_error *err)
{
	unsigned long long *bytes = calloc(la->n_args ? la->n_args : 1, sizeof(*bytes));
	char found[2048];
	unsigned n;

	if (!bytes)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (size_t a = 0; a < la->n_args; a++)
		bytes[a] = rt->buffers[la->args[a]].pb->bytes;
	ap_hostcheck_begin(bytes, (int)la->n_args);
	free(bytes);
	pool_launch(rt->pool, k->fn, rt->argv, (unsigned)k->blocks);
	n = ap_hostcheck_end(found, sizeof(found));
	if (n)
		return ap_error_set(err, AP_EINTERNAL, k->pb->name, NULL,
				    "the checking mode found %u violation%s in kernel '%s':\n%.1800s", n,
				    n == 1 ? "" : "s", k->pb->name, found);
	return 0;
}

int ap_runtime_run(ap_runtime *rt, ap_error *err)
{
	return ap_runtime_run_stream(rt, NULL, err);
}

int ap_runtime_run_stream(ap_runtime *rt, void *stream, ap_error *err)
{
	int rc = check_bound(rt, err);

	if (rc < 0 || (rc = outputs_ready(rt, err)) < 0)
		return rc;
	if (!rt->host)
		return run_gpu(rt, stream, err);
	for (size_t l = 0; l < rt->b->n_plan; l++) {
		const Apollo__Launch *la = rt->b->plan[l];
		const rt_kernel *k = &rt->kernels[la->kernel];
		double t0 = rt->launch_ms ? ap_now_ms() : 0;

		for (size_t a = 0; a < la->n_args; a++)
			rt->argv[a] = rt->buffers[la->args[a]].host;
		if (rt->checked && (rc = launch_checked(rt, la, k, err)) < 0)
			return rc;
		if (!rt->checked)
			pool_launch(rt->pool, k->fn, rt->argv, (unsigned)k->blocks);
		if (k->fault && __atomic_exchange_n(k->fault, 0, __ATOMIC_RELAXED))
			return ap_error_set(err, AP_EINTERNAL, k->pb->name, NULL,
					    "kernel '%s' deadlocked on the host: no arm of its warp specialisation "
					    "could proceed (an mbarrier wait nothing left could complete)", k->pb->name);
		if (rt->launch_ms)
			rt->launch_ms[l] += ap_now_ms() - t0;
	}
	return 0;
}

void ap_runtime_profile_reset(ap_runtime *rt)
{
	if (rt->launch_ms)
		memset(rt->launch_ms, 0, rt->b->n_plan * sizeof(*rt->launch_ms));
}

double ap_runtime_launch_ms(const ap_runtime *rt, int i)
{
	if (!rt->launch_ms || i < 0 || (size_t)i >= rt->b->n_plan)
		return -1;
	return rt->launch_ms[i];
}

ap_host_tensor *ap_runtime_output(ap_runtime *rt, int index, ap_error *err)
{
	rt_buffer *bf = NULL;
	ap_host_tensor *t;

	for (int i = 0; i < rt->n_buffers; i++)
		if (rt->buffers[i].pb->kind == APOLLO__BUFFER_KIND__BUF_OUTPUT &&
		    rt->buffers[i].pb->index == index)
			bf = &rt->buffers[i];
	if (!bf) {
		ap_error_set(err, AP_EINVAL, NULL, NULL, "the bundle has no output %d", index);
		return NULL;
	}
	if (!bf->has_storage && own_storage(rt, bf, err) < 0)
		return NULL;
	t = calloc(1, sizeof(*t));
	if (!t || !(t->name = strdup(bf->pb->name)) ||
	    !(t->data = malloc(bf->pb->bytes ? (size_t)bf->pb->bytes : 1))) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		return ap_host_tensor_free(t);
	}
	t->dtype = (ap_dtype)bf->pb->dtype;
	t->rank = (int)bf->pb->n_dims;
	for (int d = 0; d < t->rank; d++)
		t->dims[d] = bf->pb->dims[d];
	t->nbytes = (size_t)bf->pb->bytes;
	if (rt->host) {
		if (t->nbytes)
			memcpy(t->data, bf->host, t->nbytes);
	} else if (bf->zero_pending) {
		memset(t->data, 0, t->nbytes);   /* no run wrote it yet */
	} else if (t->nbytes) {
		CUresult r;
		rt->cu.cuCtxSetCurrent(rt->ctx);
		r = rt->cu.cuMemcpyDtoH(t->data, bf->dev, t->nbytes);
		if (r != 0) {
			ap_error_set(err, AP_EIO, NULL, bf->pb->name, "copying output '%s': %s",
				     bf->pb->name, cu_err(&rt->cu, r));
			return ap_host_tensor_free(t);
		}
	}
	return t;
}

/* ---- timing tuned kernels ------------------------------------------------ */

static int cmp_ms(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int ap_runtime_time_tuned(const ap_bundle *b, const ap_graph *g, int device, int warmup, int runs,
			  char *device_name, size_t cap, unsigned *sms, ap_runtime_timing_fn fn,
			  void *user, ap_error *err)
{
	ap_runtime_options ro = { .device = device, .profile = true };
	int n = ap_bundle_n_launches(b), rc;
	ap_runtime *rt;
	double *prev = NULL, *t = NULL;

	if (runs < 1)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "timing wants at least one run");
	if (!(rt = ap_runtime_new(b, &ro, err)))
		return err->code ? err->code : AP_ENOMEM;
	if (device_name && (rc = ap_runtime_device(rt, device_name, cap, sms, err)) < 0)
		goto out;
	if ((g && (rc = ap_runtime_bind_consts(rt, g, err)) < 0) ||
	    (rc = ap_runtime_bind_zeros(rt, err)) < 0)
		goto out;
	prev = calloc((size_t)n + 1, sizeof(double));
	t = calloc((size_t)n * (size_t)runs + 1, sizeof(double));
	if (!prev || !t) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto out;
	}
	for (int w = 0; w < warmup; w++)
		if ((rc = ap_runtime_run(rt, err)) < 0)
			goto out;
	for (int l = 0; l < n; l++)
		prev[l] = ap_runtime_launch_ms(rt, l);
	for (int r = 0; r < runs; r++) {
		if ((rc = ap_runtime_run(rt, err)) < 0)
			goto out;
		for (int l = 0; l < n; l++) {
			double now = ap_runtime_launch_ms(rt, l);

			t[(size_t)l * (size_t)runs + (size_t)r] = now - prev[l];
			prev[l] = now;
		}
	}
	rc = 0;
	for (int l = 0; l < n && !rc; l++) {
		ap_bundle_launch_part pt;
		double *lt = &t[(size_t)l * (size_t)runs];

		/* a launch of several micro-graphs times them together: skipped */
		if (ap_bundle_launch_n_parts(b, l) != 1 || ap_bundle_launch_part_get(b, l, 0, &pt) < 0 ||
		    !pt.tune_signature)
			continue;
		qsort(lt, (size_t)runs, sizeof(double), cmp_ms);
		if (lt[runs / 2] > 0 && (rc = fn(user, &pt, lt[runs / 2] * 1e3, (unsigned)runs)) < 0)
			ap_error_set(err, rc, NULL, NULL, "timing stopped: %s", ap_error_name(rc));
	}
out:
	free(prev);
	free(t);
	ap_runtime_free(rt);
	return rc;
}
