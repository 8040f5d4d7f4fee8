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
 * not thread-safe; several may run at once.
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
 * the bundle -- that is the connection's business, see apollo.h).
 * 0, or AP_EINVAL / AP_ETOOLARGE naming the kernel or buffer. */
int ap_runtime_check(__ap_keep const ap_bundle *b, ap_error *err);

/* ap_runtime_check, then loads the bundle's kernels and allocates its
 * buffers.  `opt` may be NULL.  Returns NULL with `err`: AP_EINVAL (a
 * malformed bundle, naming the kernel or buffer), AP_EUNSUPPORTED (a target
 * this runtime cannot run, or no CUDA driver / device: the message says
 * which), AP_ECOMPILE (dlopen, dlsym or cuModuleLoadData failed),
 * AP_ETOOLARGE, AP_ENOMEM, AP_EIO. */
__ap_give ap_runtime *ap_runtime_new(__ap_keep const ap_bundle *b,
				     const ap_runtime_options *opt, ap_error *err);
ap_runtime *ap_runtime_free(__ap_take ap_runtime *rt);   /* accepts NULL */

/* True when the bundle's target runs on the host. */
bool ap_runtime_is_host(const ap_runtime *rt);

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
 * (cuCtxSynchronize). */
int ap_runtime_run(ap_runtime *rt, ap_error *err);

/* As ap_runtime_run, but on a GPU the launches are queued on `stream` (a
 * CUstream of the runtime's device's primary context; NULL = the legacy
 * default stream) and the call returns without waiting: the caller orders
 * later work on that stream, as with any CUDA library call.  The runtime's
 * one workspace is reused by every run, so two runs of one runtime must not
 * overlap (same stream, or the caller waits).  The host target ignores
 * `stream` and returns when the plan has run.  Errors as ap_runtime_run. */
int ap_runtime_run_stream(ap_runtime *rt, void *stream, ap_error *err);

/* With ap_runtime_options.profile: the milliseconds launch `i` of the plan
 * took, summed over every run so far (host: the wall time of its blocks on
 * the runtime's threads; GPU: between CUDA events recorded around the
 * launch on its stream, each launch waited for -- or, with a driver without
 * events, from the launch until cuCtxSynchronize returned).  -1 when profiling is off or i is not a launch of the plan. */
double ap_runtime_launch_ms(const ap_runtime *rt, int i);

/* A host copy of the OUTPUT buffer with Buffer.index `index` (name, dtype,
 * dims, data).  NULL with `err` (AP_EINVAL: no such output; AP_ENOMEM;
 * AP_EIO). */
__ap_give ap_host_tensor *ap_runtime_output(ap_runtime *rt, int index, ap_error *err);

/* Whether a CUDA driver with at least one device can be used here.  When
 * not, `why` (may be NULL) receives the reason. */
bool ap_runtime_cuda_available(char *why, size_t cap);

#endif
