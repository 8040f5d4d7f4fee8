/* nvrtc.c -- CUDA C -> PTX / cubin through NVRTC, loaded with dlopen (see
 * backend.h).
 *
 * Approach: NVRTC is never linked.  The first ap_nvrtc_load() (under
 * pthread_once) looks for libnvrtc.so.<major> in, in order:
 *   1. $APOLLO_NVRTC when set: that file only ("off" = pretend none);
 *   2. $CUDA_HOME/lib64 (default /usr/local/cuda), majors 13, 12, 11;
 *   3. the project's virtual environment, where `make deps` installs the
 *      nvidia-cuda-nvrtc wheel: .venv/lib/python3* /site-packages/nvidia/
 *      * /lib/libnvrtc.so.* under the executable's directory, its parent
 *      and grandparent (build/apollod -> the repository), then the current
 *      directory;
 *   4. the dynamic loader's path, majors 13, 12, 11.
 * and resolves the entry points with dlsym.  Every major found is kept
 * (the first found of each: $CUDA_HOME's before the wheel's), newest
 * first, so that the daemon can answer a request for an older driver with
 * an older NVRTC's output (ap_nvrtc_pick).  The outcome (the function
 * tables, or the error naming every place looked in) is kept for the life
 * of the process, written once.
 *
 * Headers: NVRTC has the CUDA builtins but not the toolkit's headers, and
 * kernels with float16 / bfloat16 include <cuda_fp16.h> / <cuda_bf16.h>.
 * At load, the first directory holding cuda_fp16.h among
 *   1. the include directory next to the loaded library (LIB/../include:
 *      /usr/local/cuda/include for /usr/local/cuda/lib64/libnvrtc.so.13);
 *   2. $CUDA_HOME/include (default /usr/local/cuda/include);
 *   3. .venv/lib/python3* /site-packages/nvidia/ * /include (the wheels'
 *      headers; cuda_runtime ships them), beside the executable as above,
 *      then in the current directory;
 * becomes an -I option of every compile.  None found: no option, and a
 * kernel that needs the header fails with NVRTC's own message ("could not
 * open source file").
 *
 * Compilation: one nvrtcProgram per call, so calls from several worker
 * threads run in parallel.  Options: -arch=sm_XX for cubin, -arch=
 * compute_XX for PTX (an sm_XX target asked for PTX gets compute_XX),
 * --std=c++17, and -I as above.  No fast-math: kernels must match the
 * reference numerics.
 * NVRTC before 12.6.2 changes the locale of the calling thread, so each
 * compile runs with a private "C" locale installed by uselocale() and
 * restores the thread's previous one afterwards, and puts the global
 * locale back if NVRTC changed it.
 */
#include "backend.h"

#include "../../common/trust.h"
#include "../config.h"

#include <ctype.h>
#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* NVRTC's ABI, as declared in nvrtc.h (types re-declared: no CUDA headers
 * are needed to build Apollo). */
typedef int nvrtcResult;
typedef struct nvrtc_program_opaque *nvrtcProgram;
enum {
	NVRTC_SUCCESS = 0,
	NVRTC_ERROR_OUT_OF_MEMORY = 1,
	NVRTC_ERROR_INVALID_OPTION = 5,
	NVRTC_ERROR_COMPILATION = 6,
};

struct nvrtc_api {
	void *lib;
	nvrtcResult (*Version)(int *, int *);
	const char *(*GetErrorString)(nvrtcResult);
	nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
				     const char *const *, const char *const *);
	nvrtcResult (*DestroyProgram)(nvrtcProgram *);
	nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
	nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
	nvrtcResult (*GetPTX)(nvrtcProgram, char *);
	nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
	nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
	nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
	nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
	nvrtcResult (*GetNumSupportedArchs)(int *);   /* optional (CUDA >= 11.2) */
	nvrtcResult (*GetSupportedArchs)(int *);      /* optional */
	int major, minor;
	char version[16];
	char path[PATH_MAX];
	char include_opt[PATH_MAX + 8];  /* "-I<dir>" holding cuda_fp16.h, or "" */
	ap_error load_err;      /* AP_OK once loaded */
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
#define MAX_LIBS 4
static struct nvrtc_api libs[MAX_LIBS];  /* newest first; written once, under load_once */
static int n_libs;
static ap_error load_err;                /* why none loaded */
static struct nvrtc_api cand;            /* the library try_open is looking at */
static pthread_mutex_t global_locale_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *const majors[] = { "13", "12", "11.2", "11" };

/* Resolves every entry point from `lib`; false when one is missing. */
static bool resolve(void *lib)
{
#define SYM(field, name) (*(void **)&cand.field = dlsym(lib, name))
	SYM(Version, "nvrtcVersion");
	SYM(GetErrorString, "nvrtcGetErrorString");
	SYM(CreateProgram, "nvrtcCreateProgram");
	SYM(DestroyProgram, "nvrtcDestroyProgram");
	SYM(CompileProgram, "nvrtcCompileProgram");
	SYM(GetPTXSize, "nvrtcGetPTXSize");
	SYM(GetPTX, "nvrtcGetPTX");
	SYM(GetCUBINSize, "nvrtcGetCUBINSize");
	SYM(GetCUBIN, "nvrtcGetCUBIN");
	SYM(GetProgramLogSize, "nvrtcGetProgramLogSize");
	SYM(GetProgramLog, "nvrtcGetProgramLog");
	SYM(GetNumSupportedArchs, "nvrtcGetNumSupportedArchs");
	SYM(GetSupportedArchs, "nvrtcGetSupportedArchs");
#undef SYM
	return cand.Version && cand.GetErrorString && cand.CreateProgram && cand.DestroyProgram &&
	       cand.CompileProgram && cand.GetPTXSize && cand.GetPTX && cand.GetCUBINSize &&
	       cand.GetCUBIN && cand.GetProgramLogSize && cand.GetProgramLog;
}

/* dlopens `file` and takes it when it is a usable NVRTC. */
static bool try_open(const char *file)
{
	void *lib;
	int major = 0, minor = 0;
	ap_error err;

	/* a library is code run as the daemon's user: only one that user or
	 * root controls (common/trust.h) */
	if (access(file, F_OK) == 0 && ap_trust_path(file, "NVRTC library", 0, &err)) {
		ap_log(AP_LOG_WARN, "%s", err.msg);
		return false;
	}
	/* RTLD_NODELETE: a library we look at and put back stays mapped.
	 * NVRTC's static constructors allocate at load and free nothing; once
	 * unmapped, the only pointers to those blocks are gone with its data
	 * and LeakSanitizer reports them (a leak of an "<unknown module>"). */
	lib = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!lib)
		return false;
	if (!resolve(lib) || cand.Version(&major, &minor) != NVRTC_SUCCESS) {
		dlclose(lib);
		memset(&cand, 0, sizeof(cand));
		return false;
	}
	for (int i = 0; i < n_libs; i++)
		if (libs[i].major == major) {   /* this major is loaded already */
			dlclose(lib);
			memset(&cand, 0, sizeof(cand));
			return true;
		}
	cand.lib = lib;
	cand.major = major;
	cand.minor = minor;
	snprintf(cand.version, sizeof(cand.version), "%d.%d", major, minor);
	snprintf(cand.path, sizeof(cand.path), "%s", file);
	if (n_libs < MAX_LIBS) {
		int at = n_libs;

		while (at > 0 && libs[at - 1].major * 1000 + libs[at - 1].minor < major * 1000 + minor)
			at--;
		memmove(&libs[at + 1], &libs[at], (size_t)(n_libs - at) * sizeof(libs[0]));
		libs[at] = cand;
		n_libs++;
	} else {
		dlclose(lib);
	}
	memset(&cand, 0, sizeof(cand));
	return true;
}

static bool try_venv(const char *base)
{
	char pattern[PATH_MAX];
	glob_t g;
	bool ok = false;

	if (snprintf(pattern, sizeof(pattern),
		     "%s/.venv/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.*", base) >=
	    (int)sizeof(pattern))
		return false;
	if (glob(pattern, 0, NULL, &g))
		return false;
	/* glob sorts: the highest version first; every major is taken */
	for (size_t i = g.gl_pathc; i-- > 0;) {
		const char *p = strrchr(g.gl_pathv[i], '/');
		p = p ? p + 1 : g.gl_pathv[i];
		if (!strncmp(p, "libnvrtc.so.", 12) && isdigit((unsigned char)p[12]))
			ok |= try_open(g.gl_pathv[i]);
	}
	globfree(&g);
	return ok;
}

/* True when dir/cuda_fp16.h can be read; then it becomes the -I option of
 * the library being set up (inc). */
static struct nvrtc_api *inc;
static bool take_include(const char *dir)
{
	char file[PATH_MAX + 16];

	if (snprintf(file, sizeof(file), "%s/cuda_fp16.h", dir) >= (int)sizeof(file) ||
	    access(file, R_OK) != 0)
		return false;
	snprintf(inc->include_opt, sizeof(inc->include_opt), "-I%s", dir);
	return true;
}

static bool venv_include(const char *base)
{
	char pattern[PATH_MAX];
	glob_t g;
	bool ok = false;

	if (snprintf(pattern, sizeof(pattern),
		     "%s/.venv/lib/python3*/site-packages/nvidia/*/include/cuda_fp16.h", base) >=
	    (int)sizeof(pattern))
		return false;
	if (glob(pattern, 0, NULL, &g))
		return false;
	for (size_t i = g.gl_pathc; i-- > 0 && !ok;) {
		char *slash = strrchr(g.gl_pathv[i], '/');

		if (slash) {
			*slash = '\0';
			ok = take_include(g.gl_pathv[i]);
		}
	}
	globfree(&g);
	return ok;
}

/* The include directory (see the file comment), once NVRTC is loaded. */
static void find_include(void)
{
	const char *cuda = getenv("CUDA_HOME");
	char dir[PATH_MAX], exe[PATH_MAX], cwd[PATH_MAX];
	char *slash;
	ssize_t n;

	snprintf(dir, sizeof(dir), "%s", inc->path);
	slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';                         /* the library's directory */
		slash = strrchr(dir, '/');
		if (slash && strlen(dir) + 16 < sizeof(dir)) {
			strcpy(slash, "/include");
			if (take_include(dir))
				return;
		}
	}
	if (!cuda || !*cuda)
		cuda = "/usr/local/cuda";
	if (snprintf(dir, sizeof(dir), "%s/include", cuda) < (int)sizeof(dir) && take_include(dir))
		return;
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = '\0';
		for (int up = 0; up < 3; up++) {
			slash = strrchr(exe, '/');
			if (!slash || slash == exe)
				break;
			*slash = '\0';
			if (venv_include(exe))
				return;
		}
	}
	if (getcwd(cwd, sizeof(cwd)))
		venv_include(cwd);
}

static void load_library(void)
{
	const char *env = getenv("APOLLO_NVRTC");
	const char *cuda = getenv("CUDA_HOME");
	char file[PATH_MAX], exe[PATH_MAX], cwd[PATH_MAX];
	ssize_t n;

	if (env && *env) {
		/* $APOLLO_NVRTC: one file, or several separated by ':' */
		char list[4 * PATH_MAX], *save = NULL;

		snprintf(list, sizeof(list), "%s", env);
		for (char *f = strtok_r(list, ":", &save); f && strcmp(env, "off");
		     f = strtok_r(NULL, ":", &save))
			try_open(f);
		if (n_libs)
			return;
		ap_error_set(&load_err, AP_EUNSUPPORTED, NULL, NULL,
			     "NVRTC not found: $APOLLO_NVRTC=%s %s", env,
			     strcmp(env, "off") ? "cannot be loaded" : "turns it off");
		return;
	}
	if (!cuda || !*cuda)
		cuda = "/usr/local/cuda";
	for (size_t i = 0; i < sizeof(majors) / sizeof(majors[0]); i++) {
		snprintf(file, sizeof(file), "%s/lib64/libnvrtc.so.%s", cuda, majors[i]);
		try_open(file);
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = '\0';
		for (int up = 0; up < 3; up++) {
			char *slash = strrchr(exe, '/');
			if (!slash || slash == exe)
				break;
			*slash = '\0';
			if (try_venv(exe))
				break;
		}
	}
	if (getcwd(cwd, sizeof(cwd)))
		try_venv(cwd);
	for (size_t i = 0; !n_libs && i < sizeof(majors) / sizeof(majors[0]); i++) {
		snprintf(file, sizeof(file), "libnvrtc.so.%s", majors[i]);
		try_open(file);
	}
	if (n_libs)
		return;
	ap_error_set(&load_err, AP_EUNSUPPORTED, NULL, NULL,
		     "NVRTC not found: looked for libnvrtc.so.{13,12,11} in %s/lib64 ($CUDA_HOME), "
		     "in .venv/lib/python3*/site-packages/nvidia/*/lib beside the executable and "
		     "in the current directory (`make deps` installs the nvidia-cuda-nvrtc wheel "
		     "there), and on the loader path; GPU targets are unavailable, target cpu works",
		     cuda);
}

static void load(void)
{
	load_library();
	for (int i = 0; i < n_libs; i++) {
		inc = &libs[i];
		find_include();
	}
}

int ap_nvrtc_load(ap_error *err)
{
	pthread_once(&load_once, load);
	if (n_libs)
		return 0;
	if (err)
		*err = load_err;
	return load_err.code ? load_err.code : AP_EUNSUPPORTED;
}

const char *ap_nvrtc_version(void)
{
	pthread_once(&load_once, load);
	return n_libs ? libs[0].version : NULL;
}

int ap_nvrtc_count(void)
{
	pthread_once(&load_once, load);
	return n_libs;
}

const char *ap_nvrtc_version_of(int lib)
{
	pthread_once(&load_once, load);
	return lib >= 0 && lib < n_libs ? libs[lib].version : NULL;
}

int ap_nvrtc_pick(unsigned driver, bool cubin, ap_error *err)
{
	pthread_once(&load_once, load);
	if (!n_libs)
		return ap_nvrtc_load(err);
	if (driver == 0)
		return 0;
	for (int i = 0; i < n_libs; i++) {
		/* a cubin loads on any driver of its CUDA major (minor version
		 * compatibility); PTX needs a driver that knows its ISA: the
		 * same CUDA major.minor or newer */
		unsigned need = (unsigned)libs[i].major * 1000u + (cubin ? 0u : (unsigned)libs[i].minor * 10u);

		if (need <= driver)
			return i;
	}
	return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
			    "the CUDA driver supports CUDA %u.%u, but the oldest NVRTC here is %s, "
			    "whose %s needs a CUDA %d.%d driver or newer: update the driver, or give "
			    "apollod an older NVRTC (the nvidia-cuda-nvrtc-cu%u wheel, $APOLLO_NVRTC)",
			    driver / 1000, driver % 1000 / 10, libs[n_libs - 1].version,
			    cubin ? "cubins" : "PTX", libs[n_libs - 1].major,
			    cubin ? 0 : libs[n_libs - 1].minor, driver / 1000);
}

const char *ap_nvrtc_include_dir(void)
{
	pthread_once(&load_once, load);
	return n_libs && libs[0].include_opt[0] ? libs[0].include_opt + 2 : NULL;
}

/* Internal: the architectures NVRTC can compile for (e.g. 75, 80, 90), at
 * most `cap` of them into `out`; returns how many, 0 when NVRTC is not
 * loaded or cannot say. */
int ap__nvrtc_archs(int *out, int cap)
{
	int n = 0;
	int *all;

	const struct nvrtc_api *a = &libs[0];

	if (ap_nvrtc_load(NULL) || !a->GetNumSupportedArchs || !a->GetSupportedArchs)
		return 0;
	if (a->GetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 || n > 256)
		return 0;
	all = calloc((size_t)n, sizeof(int));
	if (!all)
		return 0;
	if (a->GetSupportedArchs(all) != NVRTC_SUCCESS)
		n = 0;
	if (n > cap)
		n = cap;
	if (n > 0)
		memcpy(out, all, (size_t)n * sizeof(int));
	free(all);
	return n;
}

/* Checks "sm_90", "sm_90a", "compute_80", ... and writes the -arch=
 * option for the requested output. */
static int arch_option(const char *arch, bool cubin, char *opt, size_t cap, ap_error *err)
{
	const char *digits;
	bool sm;
	size_t nd = 0;

	if (!arch)
		arch = "";
	sm = !strncmp(arch, "sm_", 3);
	if (!sm && strncmp(arch, "compute_", 8))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "target '%s' is not a CUDA architecture (sm_XX or compute_XX)", arch);
	digits = arch + (sm ? 3 : 8);
	while (isdigit((unsigned char)digits[nd]))
		nd++;
	if (nd < 2 || nd > 3 || (digits[nd] && (!islower((unsigned char)digits[nd]) || digits[nd + 1])))
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "target '%s' is not a CUDA architecture (sm_XX or compute_XX)", arch);
	if (cubin && !sm)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "cubin needs a real architecture (sm_XX), not the virtual '%s'", arch);
	snprintf(opt, cap, "-arch=%s_%s", cubin ? "sm" : "compute", digits);
	return 0;
}

/* Copies the first lines of the NVRTC log into err->msg after `prefix`. */
static void take_log(const struct nvrtc_api *a, nvrtcProgram prog, const char *prefix,
		     const char *arch, ap_error *err, int code)
{
	size_t n = 0;
	char *log = NULL;

	if (a->GetProgramLogSize(prog, &n) == NVRTC_SUCCESS && n > 1 && n < (64u << 20))
		log = malloc(n);
	if (log && a->GetProgramLog(prog, log) != NVRTC_SUCCESS) {
		free(log);
		log = NULL;
	}
	if (log) {
		size_t end = strlen(log);
		while (end > 0 && isspace((unsigned char)log[end - 1]))
			log[--end] = '\0';
	}
	ap_error_set(err, code, NULL, NULL, "%s (NVRTC %s, %s): %s", prefix, a->version, arch,
		     log ? log : "no log");
	free(log);
}

int ap_nvrtc_compile(const char *src, const char *name, const char *arch, bool cubin,
		     uint8_t **out, size_t *out_len, ap_error *err)
{
	return ap_nvrtc_compile_ex(src, name, arch, cubin, NULL, 0, out, out_len, NULL, err);
}

int ap_nvrtc_compile_ex(const char *src, const char *name, const char *arch, bool cubin,
			const char *const *extra, int n_extra, uint8_t **out, size_t *out_len,
			char **log, ap_error *err)
{
	return ap_nvrtc_compile_with(0, src, name, arch, cubin, extra, n_extra, out, out_len, log,
				     err);
}

int ap_nvrtc_compile_with(int lib, const char *src, const char *name, const char *arch,
			  bool cubin, const char *const *extra, int n_extra, uint8_t **out,
			  size_t *out_len, char **log, ap_error *err)
{
	const struct nvrtc_api *a;
	nvrtcProgram prog = NULL;
	char archopt[64];
	const char *opts[3 + 16];
	int n_opts = 2;
	char global_before[256];
	locale_t saved, c_locale;
	nvrtcResult r;
	size_t size = 0;
	uint8_t *buf = NULL;
	int rc;

	*out = NULL;
	*out_len = 0;
	if ((rc = ap_nvrtc_load(err)))
		return rc;
	if (lib < 0 || lib >= n_libs)
		return ap_error_set(err, AP_EINTERNAL, NULL, NULL, "no NVRTC number %d", lib);
	a = &libs[lib];
	if ((rc = arch_option(arch, cubin, archopt, sizeof(archopt), err)))
		return rc;
	opts[0] = archopt;
	opts[1] = "--std=c++17";
	if (a->include_opt[0])
		opts[n_opts++] = a->include_opt;
	if (log)
		*log = NULL;
	if (n_extra < 0 || n_extra > 16)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "%d extra NVRTC options (at most 16)", n_extra);
	for (int i = 0; i < n_extra; i++)
		opts[n_opts++] = extra[i];

	r = a->CreateProgram(&prog, src, name && *name ? name : "kernel.cu", 0, NULL, NULL);
	if (r != NVRTC_SUCCESS)
		return ap_error_set(err, r == NVRTC_ERROR_OUT_OF_MEMORY ? AP_ENOMEM : AP_EINTERNAL,
				    NULL, NULL, "nvrtcCreateProgram: %s", a->GetErrorString(r));

	/* The locale guard (see the file comment). */
	pthread_mutex_lock(&global_locale_mu);
	snprintf(global_before, sizeof(global_before), "%s", setlocale(LC_ALL, NULL));
	pthread_mutex_unlock(&global_locale_mu);
	saved = uselocale((locale_t)0);
	c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
	if (c_locale)
		uselocale(c_locale);
	r = a->CompileProgram(prog, n_opts, opts);
	uselocale(saved);
	if (c_locale)
		freelocale(c_locale);
	pthread_mutex_lock(&global_locale_mu);
	if (strcmp(global_before, setlocale(LC_ALL, NULL)))
		setlocale(LC_ALL, global_before);
	pthread_mutex_unlock(&global_locale_mu);

	if (r == NVRTC_ERROR_COMPILATION) {
		take_log(a, prog, "NVRTC compile error", archopt, err, AP_ECOMPILE);
		rc = AP_ECOMPILE;
		goto done;
	}
	if (r == NVRTC_ERROR_INVALID_OPTION) {
		take_log(a, prog, "NVRTC rejected the options", archopt, err, AP_EUNSUPPORTED);
		rc = AP_EUNSUPPORTED;
		goto done;
	}
	if (r != NVRTC_SUCCESS) {
		rc = ap_error_set(err, r == NVRTC_ERROR_OUT_OF_MEMORY ? AP_ENOMEM : AP_ECOMPILE, NULL,
				  NULL, "nvrtcCompileProgram (%s): %s", archopt, a->GetErrorString(r));
		goto done;
	}
	r = cubin ? a->GetCUBINSize(prog, &size) : a->GetPTXSize(prog, &size);
	if (r != NVRTC_SUCCESS || size == 0) {
		rc = ap_error_set(err, AP_EINTERNAL, NULL, NULL, "NVRTC returned no %s: %s",
				  cubin ? "cubin" : "PTX", a->GetErrorString(r));
		goto done;
	}
	buf = malloc(size + 1);
	if (!buf) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory for %zu bytes of %s",
				  size, cubin ? "cubin" : "PTX");
		goto done;
	}
	r = cubin ? a->GetCUBIN(prog, (char *)buf) : a->GetPTX(prog, (char *)buf);
	if (r != NVRTC_SUCCESS) {
		free(buf);
		rc = ap_error_set(err, AP_EINTERNAL, NULL, NULL, "NVRTC: %s", a->GetErrorString(r));
		goto done;
	}
	if (!cubin) {
		/* PTX: keep the terminating NUL inside the blob, as
		 * cuModuleLoadData needs it. */
		buf[size - 1] = '\0';
	}
	if (log) {
		size_t ls = 0;

		if (a->GetProgramLogSize(prog, &ls) == NVRTC_SUCCESS && (*log = malloc(ls + 1)) != NULL) {
			if (a->GetProgramLog(prog, *log) != NVRTC_SUCCESS)
				(*log)[0] = 0;
			(*log)[ls] = 0;
		}
		if (!*log) {
			free(buf);
			rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory for the NVRTC log");
			goto done;
		}
	}
	*out = buf;
	*out_len = size;
	rc = 0;
done:
	a->DestroyProgram(&prog);
	return rc;
}

/* ---- ptxas -v ------------------------------------------------------------ */

/* The number just before `what` in [from, to), or -1. */
static int number_before(const char *from, const char *to, const char *what)
{
	/* the first occurrence with a number before it (the kernel's name,
	 * quoted in the same lines, may hold the word too) */
	for (const char *p = strstr(from, what); p && p < to; p = strstr(p + 1, what)) {
		const char *q = p;

		while (q > from && q[-1] == ' ')
			q--;
		while (q > from && q[-1] >= '0' && q[-1] <= '9')
			q--;
		if (q < p && *q >= '0' && *q <= '9')
			return atoi(q);
	}
	return -1;
}

int ap_nvrtc_ptxas_stats(const char *src, const char *name, const char *arch, ap_ptxas_stats *out,
			 ap_error *err)
{
	static const char *const v[] = {"--ptxas-options=-v"};
	uint8_t *bin = NULL;
	size_t len = 0;
	char *log = NULL;
	int rc = ap_nvrtc_compile_ex(src, name, arch, true, v, 1, &bin, &len, &log, err);

	if (rc == 0 && !ap_ptxas_parse(log, name, out))
		rc = ap_error_set(err, AP_EINTERNAL, name, NULL, "no ptxas report for %s in: %.200s", name,
				  log ? log : "");
	free(bin);
	free(log);
	return rc;
}

bool ap_ptxas_parse(const char *log, const char *name, ap_ptxas_stats *out)
{
	char key[300];
	const char *entry, *props, *end;

	memset(out, 0, sizeof(*out));
	if (!log || !name)
		return false;
	/* ptxas: "Compiling entry function 'NAME' for 'sm_XX'", then "Function
	 * properties for NAME" with the stack and spill bytes, then "Used N
	 * registers, ... M bytes smem" */
	snprintf(key, sizeof(key), "entry function '%s'", name);
	entry = strstr(log, key);
	if (!entry)
		return false;
	end = strstr(entry + 1, "entry function '");
	if (!end)
		end = entry + strlen(entry);
	snprintf(key, sizeof(key), "Function properties for %s", name);
	props = strstr(entry, key);
	if (props && props < end) {
		const char *nl = strchr(props, '\n');
		const char *eol = nl ? strchr(nl + 1, '\n') : NULL;

		if (nl) {
			if (!eol)
				eol = nl + strlen(nl);
			out->spill_store_bytes = number_before(nl, eol, "bytes spill stores");
			out->spill_load_bytes = number_before(nl, eol, "bytes spill loads");
		}
	}
	out->registers = number_before(entry, end, "registers");
	out->shared_bytes = number_before(entry, end, "bytes smem");
	/* "(C7520) Potential Performance Loss: wgmma.mma_async instructions are
	 * serialized due to ... in the function 'NAME'", before the entry's report */
	snprintf(key, sizeof(key), "function '%s'", name);
	for (const char *w = strstr(log, "wgmma.mma_async instructions are serialized"); w;
	     w = strstr(w + 1, "wgmma.mma_async instructions are serialized")) {
		const char *nl = strchr(w, '\n'), *f = strstr(w, key);

		if (f && (!nl || f < nl))
			out->wgmma_serialized = true;
	}
	if (out->shared_bytes < 0)
		out->shared_bytes = 0;
	return out->registers >= 0;
}
