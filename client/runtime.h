/* runtime.h -- runs a bundle (apollo.Bundle) that apollod compiled.
 *
 * Target "cpu": every kernel blob is a host shared object exporting
 *   void NAME(void *const *args, unsigned block_begin, unsigned block_end)
 * (the host kernel ABI of server/plan/program.h).  The runtime loads each
 * blob (memfd_create, else a private temporary file; dlopen; dlsym NAME),
 * allocates one workspace for the intermediates and one host buffer per
 * input, output and parameter, and runs the launch plan in order, splitting
 * the linear block range [0, gx*gy*gz) of each launch over a few threads
 * (blocks are independent by the ABI).
 *
 * GPU targets ("sm_XX", "sm_XXa", "compute_XX"): the CUDA driver API,
 * loaded with dlopen("libcuda.so.1") per runtime (no link-time dependency;
 * $APOLLO_LIBCUDA names another driver library, e.g. a test double):
 * primary context of the chosen device, cuModuleLoadData per blob (PTX or
 * cubin), cuMemAlloc for every buffer and the workspace, cuMemcpyHtoD when
 * binding, cuLaunchKernel(grid, block, dynamic shared bytes) for every
 * launch, cuCtxSynchronize, cuMemcpyDtoH when reading an output.
 *
 * The launch contract (GPU targets), checked by ap_runtime_new before
 * anything is launched -- the blobs' architectures before any module is
 * loaded, the rest once the modules are loaded and before any buffer is
 * allocated.  Facts come from cuDeviceGetAttribute and cuFuncGetAttribute
 * (CUDA driver API reference: CUdevice_attribute, CUfunction_attribute);
 * a fact the driver does not report is not checked, and a driver without
 * those calls gets no contract check (the launch then fails as the driver
 * says).  A bundle that breaks it is refused with AP_EUNSUPPORTED, the
 * kernel in err->node and a message naming the launch, the limit and both
 * values:
 *   - architecture: a cubin (ELF, e_machine EM_CUDA; the SM number read
 *     from e_flags, bits 0-7 under EI_ABIVERSION 7 as CUDA 12 writes
 *     sm_50..sm_90a, bits 8-15 under EI_ABIVERSION 8 as CUDA 12 writes
 *     sm_100 and later and CUDA 13 writes every target) runs only on a
 *     device of its major architecture at the same or a later minor, an
 *     "a" target (e_flags, or the kernel's target string) only on its own;
 *     PTX (".target sm_XY") on any device of compute capability >= X.Y.
 *     "kernel 'k' is a cubin for sm_90 but device 0 (...) is sm_80".  A
 *     cubin shorter than an ELF header: AP_EINVAL.  cuModuleLoadData's
 *     CUDA_ERROR_NO_BINARY_FOR_GPU is AP_EUNSUPPORTED as well;
 *   - block: each of its 3 dims <= MAX_BLOCK_DIM_X/Y/Z, and x*y*z threads
 *     <= the device's MAX_THREADS_PER_BLOCK and <= the function's
 *     CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK (its .maxntid / launch
 *     bounds, or what its NUM_REGS registers per thread allow);
 *   - grid: each of its 3 dims <= MAX_GRID_DIM_X/Y/Z (blocks);
 *   - shared memory: the function's static SHARED_SIZE_BYTES + the
 *     kernel's dynamic_shared_bytes <= MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
 *     (bytes per block: 232448 on an H100, 166912 on an A100); dynamic
 *     bytes beyond the function's MAX_DYNAMIC_SHARED_SIZE_BYTES (48 KiB
 *     less the static bytes by default) are then opted into with
 *     cuFuncSetAttribute;
 *   - clusters (sm_90 and later): a bundle carries no cluster dims, the
 *     kernel's compile-time ones (__cluster_dims__, PTX .reqnctapercluster:
 *     REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH, in blocks) are the launch's.
 *     They must all be positive, divide the grid dim by dim, hold at most
 *     8 blocks (16 where NON_PORTABLE_CLUSTER_SIZE_ALLOWED is set), and
 *     the device must report CLUSTER_LAUNCH; a function with
 *     CLUSTER_SIZE_MUST_BE_SET but no required dims is refused (cuLaunchKernel
 *     gives no cluster).
 *
 * Streams: every piece of work a run issues is queued on its stream, in
 * order with its launches -- the zeroing of the workspace and of buffers
 * the runtime allocated (cuMemsetD8Async, at the first run that uses them:
 * nothing is zeroed on the legacy stream), and a wait (an event) for the
 * copies that binding by copy queued on the legacy stream.  The runtime
 * keeps one workspace per stream it ran on (at most 8), so runs of one
 * runtime queued on different streams may execute at the same time
 * without sharing intermediates (see run_gpu in runtime.c for why); what
 * they share is the memory of inputs, params and outputs: runs that
 * overlap on the device bind their own (ap_runtime_bind_ptr).
 *
 * Binding: inputs by position among the graph inputs (Buffer.index) or by
 * name, parameters by name (e.g. every PARAM of an ap_params from
 * ap_onnx_import).  Data is copied at bind time, so the caller's tensor need
 * not outlive the call.  The dtype and the byte size must equal the
 * buffer's.  Outputs and the workspace start zeroed.  Or, without a copy,
 * any input, param or output is bound to the caller's own memory
 * (ap_runtime_bind_ptr: a framework's tensors, host or device), and the
 * plan runs on the caller's CUDA stream (ap_runtime_run_stream).
 *
 * A runtime borrows its bundle: the bundle must outlive it.  One runtime is
 * not thread-safe (its calls must not overlap on the host; its runs may
 * overlap on the device, on different streams); several may run at once.
 */
#ifndef AP_CLIENT_RUNTIME_H
#define AP_CLIENT_RUNTIME_H

#include "apollo.h"

typedef struct ap_runtime ap_runtime;

typedef struct ap_runtime_options {
	int threads;   /* host threads per launch; 0 = min(online CPUs, 8) */
	int device;    /* CUDA device ordinal for GPU targets */
	bool external; /* allocate no INPUT, PARAM or OUTPUT buffer up front: the
			  caller binds each to its own memory (ap_runtime_bind_ptr);
			  one bound by copy, or an output never bound, gets its own
			  allocation when first needed */
	bool profile;  /* time every launch (GPU: CUDA events around each launch,
			  waiting for each one) */
} ap_runtime_options;

/* Checks the bundle against itself, loading nothing: every kernel, launch
 * argument and buffer index in range; grid/block of 3 values each and
 * non-zero; kernel parameter count equal to each launch's argument count;
 * argument dtype equal to the buffer's; intermediates inside the
 * workspace; buffer bytes equal to dims x dtype size; every blob equal to
 * its SHA-256 digest (a blob is native code: one that is not the bytes the
 * daemon named is never loaded; the digest proves integrity, not who made
 * the bundle -- that is the connection's business, see apollo.h); every
 * tensor map (apollo.TensorMap) with as many values as its rank, of its
 * param's type, accepted by cuTensorMapEncodeTiled's rules
 * (common/tmap.h), on a buffer holding every byte it reaches.
 * 0, or AP_EINVAL / AP_ETOOLARGE naming the kernel or buffer. */
int ap_runtime_check(__ap_keep const ap_bundle *b, ap_error *err);

/* ap_runtime_check, then loads the bundle's kernels, checks the launch
 * contract (GPU, see above) and allocates its buffers.  `opt` may be NULL.
 * Returns NULL with `err`: AP_EINVAL (a malformed bundle, naming the kernel
 * or buffer), AP_EUNSUPPORTED (a target this runtime cannot run, no CUDA
 * driver / device, a launch the device cannot run, or tensor maps with a
 * driver lacking cuTensorMapEncodeTiled: the message says which),
 * AP_ECOMPILE (dlopen, dlsym or cuModuleLoadData failed),
 * AP_ETOOLARGE, AP_ENOMEM, AP_EIO. */
__ap_give ap_runtime *ap_runtime_new(__ap_keep const ap_bundle *b,
				     const ap_runtime_options *opt, ap_error *err);
ap_runtime *ap_runtime_free(__ap_take ap_runtime *rt);   /* accepts NULL */

/* True when the bundle's target runs on the host. */
bool ap_runtime_is_host(const ap_runtime *rt);

/* Library launches (apollo.LibraryCall, client/library.h): returns how
 * many launches of the plan carry one; *fallbacks (if not NULL) how many
 * of those ran Apollo's own kernel in the last run (all of them on the
 * host target, or where libcublasLt could not be loaded: $APOLLO_LIBCUBLASLT,
 * else libcublasLt.so.13/.12/.11), and why (up to cap bytes, "" when none
 * fell back). */
int ap_runtime_library(const ap_runtime *rt, int *fallbacks, char *why, size_t cap);

/* Number of INPUT buffers; the largest Buffer.index + 1. */
int ap_runtime_n_inputs(const ap_runtime *rt);
/* Number of OUTPUT buffers. */
int ap_runtime_n_outputs(const ap_runtime *rt);

/* Copies `t` into the INPUT buffer with Buffer.index `index`.  Errors:
 * AP_EINVAL (no such input), AP_ESHAPE (dtype or byte size differs from the
 * buffer's: the message gives both), AP_EIO (a CUDA copy failed). */
int ap_runtime_bind_input(ap_runtime *rt, int index, __ap_keep const ap_host_tensor *t,
			  ap_error *err);
/* Copies `t` into the INPUT or PARAM buffer named `name`.  Errors as
 * ap_runtime_bind_input. */
int ap_runtime_bind_name(ap_runtime *rt, const char *name, __ap_keep const ap_host_tensor *t,
			 ap_error *err);
/* Binds every PARAM buffer from `params` by name.  AP_EINVAL naming the first
 * PARAM buffer that `params` lacks and that was not bound before; else as
 * ap_runtime_bind_input. */
int ap_runtime_bind_params(ap_runtime *rt, __ap_keep const ap_params *params, ap_error *err);

/* Binds every PARAM buffer not bound yet that names a CONST tensor of `g`
 * (the graph that was compiled) from that tensor's bytes, for a compiler
 * that hands small constants to its kernels as buffers.  Errors as
 * ap_runtime_bind_input. */
int ap_runtime_bind_consts(ap_runtime *rt, __ap_keep const ap_graph *g, ap_error *err);

/* Binds every INPUT and PARAM buffer not bound yet to zeros, for runs
 * whose results nobody reads (timing: apollo-client tune; zero indices
 * are in range for every gather).  Errors: AP_ENOMEM (allocation). */
int ap_runtime_bind_zeros(ap_runtime *rt, ap_error *err);

/* The GPU a GPU runtime runs on: its name (cuDeviceGetName, NUL-terminated
 * in `cap` bytes) and its multiprocessor count.  0, or AP_EUNSUPPORTED (the
 * host target; a driver without those calls), AP_EIO. */
int ap_runtime_device(const ap_runtime *rt, char *name, size_t cap, unsigned *sms,
		      ap_error *err);

/* One timed candidate of ap_runtime_time_tuned: the launch part (borrowed
 * for the call), the median of its launch's times in microseconds, and
 * how many runs were timed.  Returns 0, or a negative AP_E* to stop. */
typedef int (*ap_runtime_timing_fn)(void *user, const ap_bundle_launch_part *part,
				    double median_us, unsigned runs);

/* Times the tuned kernels of a bundle compiled with tune_variant (each
 * tuned kernel alone in its launch): loads it on CUDA device `device`
 * (profiling on), binds g's constants (g may be NULL: the bundle's own)
 * and zeros everywhere else (ap_runtime_bind_zeros), runs the plan
 * `warmup` times, then `runs` (>= 1) times timed, and calls fn once per
 * launch that runs exactly one part carrying a tune_signature, with the
 * median of its `runs` times (CUDA events, the device's clock).  When
 * `device_name` is not NULL, it gets the device's name (cap bytes) and
 * *sms its SM count.  Used by apollo-client tune and the daemon's
 * background tuner.  0, fn's error, or those of ap_runtime_new,
 * ap_runtime_run, ap_runtime_device (AP_EUNSUPPORTED without a CUDA driver
 * or device), AP_ENOMEM. */
int ap_runtime_time_tuned(__ap_keep const ap_bundle *b, __ap_keep const ap_graph *g, int device,
			  int warmup, int runs, char *device_name, size_t cap, unsigned *sms,
			  ap_runtime_timing_fn fn, void *user, ap_error *err);

/* ap_runtime_time_tuned and ap_runtime_cuda_available as a kernel timer
 * (common/kernel_timer.h), for the daemon's background tuner: apollod
 * passes it in ap_autotune_options.timer (client/kernel_timer.c). */
extern const struct ap_kernel_timer ap_runtime_kernel_timer;

/* Binds buffer `buffer` -- its index among the bundle's buffers
 * (ap_bundle_buffer_get), of kind INPUT, PARAM or OUTPUT -- to the caller's
 * memory, without a copy: `ptr` is a host address for target cpu and a
 * CUdeviceptr (device address) for GPU targets, row-major data of the
 * buffer's dtype and dims, `bytes` long.  The memory must stay valid, and
 * inputs unchanged, until a run using it has finished (on a GPU: until the
 * stream it ran on has reached that point); it is never freed by the
 * runtime.  An OUTPUT bound this way is not zeroed first (every element is
 * written by the plan).  A later bind of the same buffer replaces this one.
 * Errors: AP_EINVAL (no such buffer; an intermediate; ptr NULL while bytes
 * > 0; ptr not 16-byte aligned, as vector loads and stores need),
 * AP_ESHAPE (bytes differ from the buffer's, the message gives both). */
int ap_runtime_bind_ptr(ap_runtime *rt, int buffer, void *ptr, uint64_t bytes, ap_error *err);

/* Runs the plan once.  AP_EINVAL when an INPUT or PARAM buffer was never
 * bound (naming it); AP_ENOMEM when an unbound output cannot be allocated;
 * AP_EIO when a CUDA launch fails.  On a GPU it waits for the launches
 * (cuCtxSynchronize), so an error a kernel raises on the device
 * (asynchronously, e.g. CUDA_ERROR_ILLEGAL_ADDRESS) is reported by this
 * run (AP_EIO, the driver's name for it); with profiling on, each launch
 * is waited for and the failing one is named. */
int ap_runtime_run(ap_runtime *rt, ap_error *err);

/* As ap_runtime_run, but on a GPU the launches are queued on `stream` (a
 * CUstream of the runtime's device's primary context; NULL = the legacy
 * default stream) and the call returns without waiting: the caller orders
 * later work on that stream, as with any CUDA library call; an error a
 * kernel raises on the device is reported by the caller's next wait on
 * that stream (cuStreamSynchronize), not by this call.  Each stream has a
 * workspace of its own (made and zeroed on that stream at its first run),
 * so runs on different streams may overlap; AP_EBUSY for a run on a ninth
 * stream.  The host target ignores `stream` and returns when the plan has
 * run.  Errors as ap_runtime_run. */
int ap_runtime_run_stream(ap_runtime *rt, void *stream, ap_error *err);

/* With ap_runtime_options.profile: the milliseconds launch `i` of the plan
 * took, summed over every run so far (host: the wall time of its blocks on
 * the runtime's threads; GPU: between CUDA events recorded around the
 * launch on its stream, each launch waited for -- or, with a driver without
 * events, from the launch until cuCtxSynchronize returned).  -1 when profiling is off or i is not a launch of the plan. */
double ap_runtime_launch_ms(const ap_runtime *rt, int i);
/* Sets every launch's profiled time back to zero, so that what follows
 * leaves out the runs before: the first run of a runtime pays for loading
 * the modules' kernels (the driver loads them lazily at their first
 * launch) and for initialising cuBLASLt, up to hundreds of milliseconds
 * against a kernel's microseconds.  No effect when profiling is off. */
void ap_runtime_profile_reset(ap_runtime *rt);

/* A host copy of the OUTPUT buffer with Buffer.index `index` (name, dtype,
 * dims, data).  NULL with `err` (AP_EINVAL: no such output; AP_ENOMEM;
 * AP_EIO). */
__ap_give ap_host_tensor *ap_runtime_output(ap_runtime *rt, int index, ap_error *err);

/* Whether a CUDA driver with at least one device can be used here.  When
 * not, `why` (may be NULL) receives the reason. */
bool ap_runtime_cuda_available(char *why, size_t cap);

#endif
