/* library.h -- launches a bundle computes with a library call instead of
 * Apollo's kernel (apollo.LibraryCall, issue 25): today cuBLASLt's matmul,
 * loaded with dlopen so that nothing links against it.
 *
 * The runtime (runtime.c) checks every launch's LibraryCall against the
 * bundle when it checks the bundle (ap_library_check, no library needed),
 * tries to load libcublasLt once per GPU runtime that has a library launch
 * (ap_cublaslt_open), and runs each such launch through ap_cublaslt_matmul
 * on the run's stream; where the library cannot be loaded, or refuses a
 * product, the launch's own kernel (Launch.kernel, the same product) runs
 * instead.
 */
#ifndef APOLLO_CLIENT_LIBRARY_H
#define APOLLO_CLIENT_LIBRARY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base.h"
#include "proto/apollo.pb-c.h"

/* Checks launch l's LibraryCall (if it has one) against the bundle: the
 * op, the data types (float16/bfloat16/float inputs of one type; D of that
 * type or float; C and bias of D's type) against the buffers' dtypes, the
 * arg indices against the launch's args (A, B and D distinct buffers; D
 * not an input, param or constant), every dim and leading dimension
 * (m, n, k >= 1; a row-major ld >= the row's length), the last element
 * each operand's batches reach (batch - 1) * stride + (rows - 1) * ld +
 * cols against the bytes the launch may touch of that arg (arg_bytes),
 * D's batches not overlapping, and the workspace slice inside the bundle's
 * workspace.  0, or AP_EINVAL with a message naming the launch, the field
 * and the values.  Call after the launch's args and arg_bytes were checked. */
int ap_library_check(const Apollo__Bundle *b, size_t l, ap_error *err);

/* Bytes of the bundle's workspace that launch la's library call needs:
 * the end of its slice (0 without one).  For the runtime's workspace-size
 * check. */
uint64_t ap_library_workspace_end(const Apollo__Launch *la);

/* The loaded library: the handle and the entry points. */
typedef struct ap_cublaslt ap_cublaslt;

/* Loads libcublasLt: $APOLLO_LIBCUBLASLT if set ("off": none, so that
 * every library launch runs Apollo's kernel -- how bench/ times Apollo's
 * own kernels of the products the plan gives to the library), else
 * libcublasLt.so.13, .12, .11 in that order; resolves its entry points and creates a handle
 * (cublasLtCreate).  NULL with the reason in why (up to cap bytes).  Owned
 * by the caller: ap_cublaslt_close. */
ap_cublaslt *ap_cublaslt_open(char *why, size_t cap);

/* Frees every cached plan, the handle, and unloads the library.  NULL: no-op. */
void ap_cublaslt_close(ap_cublaslt *lt);

/* A launch's cached descriptors and heuristic (made by its first call). */
typedef struct ap_lib_plan ap_lib_plan;

/* Runs a checked LibraryCall: dev[a] is the device address of the
 * launch's arg a, ws the device address of the run's workspace (the call
 * uses [ws + workspace_offset, + workspace_bytes)), stream the run's
 * stream (a CUstream; NULL: the legacy stream).  Apollo's tensors are
 * row-major, cuBLASLt's column-major: the call computes D^T = op(B)^T
 * op(A)^T, i.e. cuBLASLt's A is Apollo's B and its B Apollo's A, m and n
 * swapped, and the bias (one per column of Apollo's D) is one per row of
 * cuBLASLt's D.  *plan caches the descriptors and the chosen algorithm
 * (cublasLtMatmulAlgoGetHeuristic, first answer) across runs; free it with
 * ap_cublaslt_close (plans are kept on lt).  0; AP_EUNSUPPORTED when the
 * library set up no plan (a descriptor or the heuristic refused: the
 * caller runs its own kernel); AP_EIO when cublasLtMatmul failed. */
int ap_cublaslt_matmul(ap_cublaslt *lt, ap_lib_plan **plan, const Apollo__LibraryCall *lc,
		       const unsigned long long *dev, unsigned long long ws, void *stream,
		       const char *kname, ap_error *err);

/* Calls to cublasLtMatmul this process made (tests, --explain). */
unsigned long ap_cublaslt_calls(void);

#endif
