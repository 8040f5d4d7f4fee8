/* backend.h -- turning a kernel's source text into a loadable blob.
 *
 * Two backends: NVRTC (loaded with dlopen, so the daemon still serves the
 * host target where CUDA is absent) for CUDA C -> PTX or cubin, and the
 * system C compiler for host C -> shared object (target "cpu").
 * Both are safe to call from several worker threads at once.
 */
#ifndef AP_BACKEND_H
#define AP_BACKEND_H

#include "../../common/base.h"

/* ---- NVRTC (nvrtc.c) ----------------------------------------------------- */

/* Loads libnvrtc.so.<major> from $CUDA_HOME/lib64 (default /usr/local/cuda),
 * then the project's virtual environment (.venv, nvidia-cuda-nvrtc wheel),
 * then the loader path.  Idempotent and thread-safe.  Returns 0, or
 * AP_EUNSUPPORTED with `err` saying where it looked. */
int ap_nvrtc_load(ap_error *err);
/* "13.0" once loaded (the newest NVRTC loaded), else NULL. */
const char *ap_nvrtc_version(void);
/* How many NVRTC libraries are loaded (one per CUDA major found: the
 * system's and the nvidia-cuda-nvrtc wheels side by side), newest first;
 * index i's version ("12.9"), NULL when there is none. */
int ap_nvrtc_count(void);
const char *ap_nvrtc_version_of(int lib);
/* Driver negotiation: the index of the newest loaded NVRTC whose output a
 * CUDA driver supporting CUDA `driver` (cuDriverGetVersion: 1000 * major
 * + 10 * minor; 0 = not said: the newest) can load.  A cubin loads on any
 * driver of its CUDA major or newer (CUDA's minor version compatibility);
 * PTX needs a driver of its NVRTC's major.minor or newer (the PTX ISA
 * version it writes).  Returns the index, or AP_EUNSUPPORTED with `err`
 * naming the driver's CUDA version and the oldest NVRTC here (or NVRTC's
 * absence).  Source: CUDA Compatibility guide (minor version
 * compatibility; PTX JIT). */
int ap_nvrtc_pick(unsigned driver, bool cubin, ap_error *err);
/* The directory every compile gets as -I (the first holding cuda_fp16.h of
 * LIB/../include next to the loaded NVRTC, $CUDA_HOME/include, the .venv
 * nvidia wheels' include directories), or NULL when NVRTC is not loaded or
 * none holds it (kernels using float16 / bfloat16 then fail to compile). */
const char *ap_nvrtc_include_dir(void);
/* Compiles one CUDA C translation unit for `arch` ("sm_90", "sm_90a",
 * "compute_80"): cubin when `cubin` is true (needs an sm_ arch), else PTX
 * (NUL-terminated text).  Saves and restores the thread's locale around
 * nvrtcCompileProgram (NVRTC before 12.6.2 changes it).  On success *out
 * (malloc'd, caller frees) and *out_len are set.  Errors: AP_EUNSUPPORTED
 * (NVRTC not loaded, bad arch), AP_ECOMPILE (with the first lines of the
 * NVRTC log in err->msg), AP_ENOMEM. */
int ap_nvrtc_compile(const char *src, const char *name, const char *arch, bool cubin,
		     __ap_give uint8_t **out, size_t *out_len, ap_error *err);
/* As ap_nvrtc_compile, with up to 16 more NVRTC options (e.g.
 * "--ptxas-options=-v", whose report of registers, spills and shared
 * memory per kernel lands in the log when compiling to cubin) and, when
 * `log` is not NULL, the program log in *log (malloc'd, caller frees; ""
 * when empty).  Errors as ap_nvrtc_compile, and AP_EINVAL for more than 16
 * options. */
int ap_nvrtc_compile_ex(const char *src, const char *name, const char *arch, bool cubin,
			const char *const *extra, int n_extra, __ap_give uint8_t **out, size_t *out_len,
			__ap_give char **log, ap_error *err);

/* As ap_nvrtc_compile_ex with NVRTC number `lib` (ap_nvrtc_pick; 0 is the
 * newest, which the two above use).  AP_EINTERNAL for a number not loaded. */
int ap_nvrtc_compile_with(int lib, const char *src, const char *name, const char *arch,
			  bool cubin, const char *const *extra, int n_extra,
			  __ap_give uint8_t **out, size_t *out_len, __ap_give char **log,
			  ap_error *err);

/* What ptxas -v said of kernel `name` in an NVRTC log: registers per
 * thread, spill stores and loads (bytes), static shared memory (bytes),
 * and whether it serialised the kernel's wgmma (its info C7520).  True
 * when the log has the kernel's "Used N registers" line. */
typedef struct ap_ptxas_stats {
	int registers;
	int spill_store_bytes, spill_load_bytes;
	int shared_bytes;
	bool wgmma_serialized;   /* ptxas's C7520: the kernel's wgmma.mma_async run one at a
				    time (each waited for before the next issues) */
} ap_ptxas_stats;
bool ap_ptxas_parse(const char *log, const char *name, ap_ptxas_stats *out);
/* Compiles `src` to a cubin for `arch` with ptxas -v and reads kernel
 * `name`'s figures into *out.  Errors: those of ap_nvrtc_compile_ex, and
 * AP_EINTERNAL when the log has no report for the kernel (the log's start
 * in err->msg). */
int ap_nvrtc_ptxas_stats(const char *src, const char *name, const char *arch, ap_ptxas_stats *out,
			 ap_error *err);

/* ---- host C compiler (hostcc.c) ----------------------------------------- */

/* Whether host kernels get their x86-64-v3 clone: true unless
 * $APOLLO_HOST_CLONES is "0" (hostcc.c's comment). */
bool ap_hostcc_clones(void);

/* Compiles one C11 translation unit with $APOLLO_CC (default "cc") as
 * `-O3 -ffp-contract=off -shared -fPIC -lm` (and -DAP_HOST_ISA= when
 * ap_hostcc_clones() is false) into a shared object, returned as bytes in *out
 * (malloc'd, caller frees).  Works in a private temporary directory that is
 * removed afterwards.  Errors: AP_ECOMPILE (compiler log in err->msg),
 * AP_EIO, AP_ENOMEM. */
int ap_hostcc_compile(const char *src, __ap_give uint8_t **out, size_t *out_len,
		      ap_error *err);

#endif
