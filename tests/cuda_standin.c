/* cuda_standin.c -- a stand-in CUDA driver (libcuda.so.1) for machines
 * without a GPU, built as build/tests/libcuda-standin.so and loaded by the
 * runtime through $APOLLO_LIBCUDA.  Device memory is host memory.  Three
 * kinds of image:
 *   "FAKEPTX ..." naming kernels: add_one adds 1 to every float of its
 *   first argument into its second (check_runtime's hand-made bundles);
 *   real PTX (".version", ".target sm_XX", ".entry NAME(" with ".param"
 *   lines, and the entry's directives .maxntid / .reqntid /
 *   .reqnctapercluster / .explicitcluster and its .shared arrays);
 *   a cubin (an ELF whose e_machine is EM_CUDA): its architecture read from
 *   e_flags, a kernel NAME found by its section .text.NAME, its static
 *   shared memory by .nv.shared.NAME, its .maxntid and cluster dims by
 *   .nv.info.NAME, its registers by .nv.info.
 * A launch of a PTX or cubin kernel is only recorded -- kernel, grid,
 * block, dynamic shared bytes, stream and every parameter's value (the
 * device addresses bound) -- so the plumbing of a real bundle (modules,
 * functions, bindings, the caller's stream) is checked.
 *
 * It refuses what libcuda refuses, where that can be known without
 * executing anything (CUDA driver API reference, CUDA 13.0 cuda.h):
 *   cuModuleLoadData: a cubin for another architecture than the device's
 *     major at the same or a lower minor (an "a" cubin: exactly the
 *     device's) -> CUDA_ERROR_NO_BINARY_FOR_GPU (209); PTX whose .target is
 *     newer than the device -> CUDA_ERROR_INVALID_PTX (218, the JIT fails);
 *     anything else -> CUDA_ERROR_INVALID_IMAGE (200);
 *   cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, v) with v beyond the
 *     opt-in limit less the static shared memory -> CUDA_ERROR_INVALID_VALUE;
 *   cuLaunchKernel: a zero or too large grid or block dimension, or more
 *     than 1024 threads -> CUDA_ERROR_INVALID_VALUE (1); more threads than
 *     the function's maximum (.maxntid, registers) ->
 *     CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701); more dynamic shared memory
 *     than the function's MAX_DYNAMIC_SHARED_SIZE_BYTES ->
 *     CUDA_ERROR_INVALID_VALUE; a compile-time cluster that does not divide
 *     the grid, is larger than 8 blocks (16 where the function allows
 *     non-portable sizes) or runs on a device without clusters, or a
 *     function that must have a cluster launched without one ->
 *     CUDA_ERROR_INVALID_CLUSTER_SIZE (912);
 *   cuTensorMapEncodeTiled: a map not 64-byte aligned or a description
 *     the Driver API's rules refuse (common/tmap.c, ap_tmap_check) ->
 *     CUDA_ERROR_INVALID_VALUE.
 *
 * Environment:
 *   APOLLO_STANDIN_DEVICE=h100 (default) | a100: the device profile, read
 *     at cuInit -- h100: sm_90, 132 SMs, 232448 bytes (227 KiB) of opt-in
 *     shared memory per block, cluster launch; a100: sm_80, 108 SMs,
 *     166912 bytes (163 KiB), no clusters.  Both: 1024 threads per block,
 *     blocks up to 1024 x 1024 x 64, grids up to (2^31 - 1) x 65535 x 65535,
 *     48 KiB of shared memory per block without opting in.
 *   APOLLO_STANDIN_FAULT=N: the launch that makes fake_launches reach N
 *     faults asynchronously: it returns CUDA_SUCCESS, and the next
 *     synchronising call (cuCtxSynchronize, cuStreamSynchronize,
 *     cuEventSynchronize, a synchronous copy) returns
 *     CUDA_ERROR_ILLEGAL_ADDRESS (700), as does every call after it but the
 *     frees (the error is sticky, as a real kernel fault's is) until
 *     fake_reset_fault().
 *
 * Counters and the logs (launches; memory operations with the stream each
 * used; one sequence number over both) are exported for tests (dlsym,
 * ctypes).
 */
#include "common/tmap.h"
#include <elf.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long dptr;

#define FAKE_LOG 4096
#define FAKE_MAX_PARAMS 64

enum {
	OK = 0,
	E_INVALID_VALUE = 1,
	E_OUT_OF_MEMORY = 2,
	E_INVALID_DEVICE = 101,
	E_INVALID_IMAGE = 200,
	E_INVALID_CONTEXT = 201,
	E_NO_BINARY_FOR_GPU = 209,
	E_INVALID_PTX = 218,
	E_NOT_FOUND = 500,
	E_ILLEGAL_ADDRESS = 700,
	E_LAUNCH_OUT_OF_RESOURCES = 701,
	E_NOT_PERMITTED = 800,
	E_INVALID_CLUSTER_SIZE = 912,
};

/* python_api.py reads this layout with ctypes: keep it. */
typedef struct fake_launch {
	char kernel[128];
	unsigned grid[3], block[3], smem;
	void *stream;
	int n_params;
	dptr params[FAKE_MAX_PARAMS];
} fake_launch;

/* One memory operation: op 'A' cuMemsetD8Async, 'S' cuMemsetD8 (the legacy
 * stream, synchronous), 'H' cuMemcpyHtoD, 'D' cuMemcpyDtoH, 'W'
 * cuStreamWaitEvent, 'R' cuEventRecord; stream NULL for the synchronous
 * ones. */
typedef struct fake_memop {
	char op;
	dptr ptr;
	size_t bytes;
	void *stream;
	int seq;
} fake_memop;

typedef struct fake_fn {
	char name[128];
	int n_params;        /* -1: add_one */
	int max_threads;     /* .maxntid / .reqntid product; 1024 without */
	int static_smem;     /* bytes */
	int regs;            /* per thread */
	int max_dyn_smem;    /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
	int cluster[3];      /* compile-time cluster dims; 0 0 0 = none */
	int cluster_must;    /* .explicitcluster */
	int non_portable;
} fake_fn;

typedef struct fake_module {
	int kind;            /* 'F' FAKEPTX, 'P' PTX, 'C' cubin */
	char *text;          /* F, P: the image */
	uint8_t *bin;        /* C: the image */
	size_t len;
} fake_module;

typedef struct fake_device {
	const char *name;
	int sm;              /* major * 10 + minor */
	int sms;
	int smem_optin;      /* per block, opting in */
	int smem_sm;         /* per multiprocessor */
	int cluster;         /* cluster launch */
} fake_device;

static const fake_device profiles[] = {
	{ "Apollo stand-in GPU", 90, 132, 232448, 233472, 1 },          /* H100 SXM */
	{ "Apollo stand-in GPU (A100)", 80, 108, 166912, 167936, 0 },   /* A100 */
};
static const fake_device *dev = &profiles[0];

double fake_launch_ms(unsigned blocks, unsigned threads, unsigned smem);
extern double fake_clock_ms;
int fake_launches, fake_allocs, fake_smem_attr, fake_ctx, fake_modules;
unsigned fake_grid[3], fake_block[3], fake_smem;
size_t fake_image_len;
void *fake_last_stream;
int fake_log_n;
fake_launch fake_log[FAKE_LOG];
int fake_launch_seq[FAKE_LOG];     /* fake_seq of each logged launch */
int fake_mem_n;
fake_memop fake_mem_log[FAKE_LOG];
int fake_seq;
int fake_sync_memsets;             /* cuMemsetD8 calls (the legacy stream, synchronous) */
int fake_faults;                   /* launches that faulted */
int fake_last_error;               /* the last error a launch or load returned */
static int fault_pending, fault_sticky;

void fake_reset_fault(void) { fault_pending = fault_sticky = 0; }

/* A synchronising call: reports a fault left by an earlier launch. */
static int sync_point(void)
{
	if (fault_pending || fault_sticky) {
		fault_pending = 0;
		fault_sticky = 1;
		return E_ILLEGAL_ADDRESS;
	}
	return OK;
}

static void memop(char op, dptr p, size_t n, void *st)
{
	if (fake_mem_n < FAKE_LOG)
		fake_mem_log[fake_mem_n++] = (fake_memop){ op, p, n, st, ++fake_seq };
}

int cuInit(unsigned f)
{
	const char *d = getenv("APOLLO_STANDIN_DEVICE");

	(void)f;
	if (!d || !*d || !strcmp(d, "h100"))
		dev = &profiles[0];
	else if (!strcmp(d, "a100"))
		dev = &profiles[1];
	else
		return E_INVALID_VALUE;
	return OK;
}

int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int o) { if (o) return E_INVALID_DEVICE; *d = 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; fake_ctx++; *c = (void *)1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { (void)d; fake_ctx--; return 0; }
int cuCtxSetCurrent(void *c) { return c == (void *)1 ? 0 : E_INVALID_CONTEXT; }
int cuCtxSynchronize(void) { return sync_point(); }
int cuStreamSynchronize(void *st) { (void)st; return sync_point(); }

/* ---- images --------------------------------------------------------------- */

/* The architecture of a cubin, major * 10 + minor, from its ELF header (the
 * layouts as NVRTC 12.9 and 13.0 write them): EI_ABIVERSION 7 keeps it in
 * e_flags bits 0-7 (sm_90: 0x005a055a; 0x800 marks sm_90a), EI_ABIVERSION
 * 8 in bits 8-15 (sm_90: 0x06005a04; 0x8 marks an "a" target).  -1 when
 * this is no cubin or its layout is unknown. */
static int cubin_sm(const uint8_t *img, bool *arch_specific)
{
	Elf64_Ehdr h;

	memcpy(&h, img, sizeof(h));
	if (memcmp(h.e_ident, ELFMAG, SELFMAG) || h.e_ident[EI_CLASS] != ELFCLASS64 ||
	    h.e_machine != EM_CUDA)
		return -1;
	if (h.e_ident[EI_ABIVERSION] == 7) {
		*arch_specific = h.e_flags & 0x800;
		return (int)(h.e_flags & 0xff);
	}
	if (h.e_ident[EI_ABIVERSION] == 8) {
		*arch_specific = h.e_flags & 0x8;
		return (int)((h.e_flags >> 8) & 0xff);
	}
	return -1;
}

/* Bytes of a cubin: as far as its section headers and sections reach. */
static size_t cubin_len(const uint8_t *img)
{
	Elf64_Ehdr h;
	size_t end;

	memcpy(&h, img, sizeof(h));
	end = h.e_shoff + (size_t)h.e_shnum * h.e_shentsize;
	for (unsigned i = 0; i < h.e_shnum && h.e_shentsize == sizeof(Elf64_Shdr); i++) {
		Elf64_Shdr s;

		memcpy(&s, img + h.e_shoff + (size_t)i * sizeof(s), sizeof(s));
		if (s.sh_type != SHT_NOBITS && s.sh_offset + s.sh_size > end)
			end = s.sh_offset + s.sh_size;
	}
	return end > sizeof(h) ? end : sizeof(h);
}

/* Whether a device of architecture `sm` runs code for `want`: a cubin on
 * its own major at the same or a later minor ("a": only its own); PTX on
 * any later device ("a": only its own). */
static bool runs_on(int want, bool arch_specific, bool ptx, int sm)
{
	if (arch_specific)
		return want == sm;
	if (ptx)
		return want <= sm;
	return want / 10 == sm / 10 && want % 10 <= sm % 10;
}

/* The PTX module's ".target sm_XY[a|f]": XY, or -1. */
static int ptx_target(const char *m, bool *arch_specific)
{
	const char *t = strstr(m, ".target");
	char *end;
	long v;

	if (!t)
		return -1;
	t += 7;
	while (*t == ' ' || *t == '\t')
		t++;
	if (strncmp(t, "sm_", 3))
		return -1;
	v = strtol(t + 3, &end, 10);
	*arch_specific = *end == 'a';
	return (int)v;
}

int cuModuleLoadData(void **m, const void *img)
{
	fake_module *mod;
	bool a = false;
	int sm;

	if (fault_sticky)
		return E_ILLEGAL_ADDRESS;
	mod = calloc(1, sizeof(*mod));
	if (!mod)
		return E_OUT_OF_MEMORY;
	if (!memcmp(img, ELFMAG, SELFMAG)) {
		if ((sm = cubin_sm(img, &a)) < 0) {
			free(mod);
			return fake_last_error = E_INVALID_IMAGE;
		}
		if (!runs_on(sm, a, false, dev->sm)) {
			free(mod);
			return fake_last_error = E_NO_BINARY_FOR_GPU;
		}
		mod->kind = 'C';
		mod->len = cubin_len(img);
		mod->bin = malloc(mod->len);
		if (mod->bin)
			memcpy(mod->bin, img, mod->len);
	} else if (!strncmp(img, "FAKEPTX", 7) || strstr(img, ".version")) {
		mod->kind = strncmp(img, "FAKEPTX", 7) ? 'P' : 'F';
		if (mod->kind == 'P' && (sm = ptx_target(img, &a)) >= 0 && !runs_on(sm, a, true, dev->sm)) {
			free(mod);
			return fake_last_error = E_INVALID_PTX;
		}
		mod->len = strlen(img);
		mod->text = strdup(img);
	} else {
		free(mod);
		return fake_last_error = E_INVALID_IMAGE;
	}
	if (!mod->text && !mod->bin) {
		free(mod);
		return E_OUT_OF_MEMORY;
	}
	fake_image_len = mod->len;
	*m = mod;
	fake_modules++;
	return OK;
}

int cuModuleUnload(void *m)
{
	fake_module *mod = m;

	free(mod->text);
	free(mod->bin);
	free(mod);
	fake_modules--;
	return OK;
}

/* ---- PTX entries ---------------------------------------------------------- */

/* Entry `name` in PTX text m: its ".entry name" or NULL. */
static const char *ptx_entry(const char *m, const char *name)
{
	const char *p = m;
	size_t len = strlen(name);

	while ((p = strstr(p, ".entry ")) != NULL) {
		p += 7;
		while (*p == ' ')
			p++;
		if (!strncmp(p, name, len) && (p[len] == '(' || p[len] == ' ' || p[len] == '\n'))
			return p;
	}
	return NULL;
}

/* Up to three integers after directive `d` between p and end ("1" for the
 * missing ones); their product, or 0 when the directive is not there. */
static int ptx_dims(const char *p, const char *end, const char *d, int out[3])
{
	const char *q = strstr(p, d);
	char *e;

	out[0] = out[1] = out[2] = 1;
	if (!q || q >= end)
		return 0;
	q += strlen(d);
	for (int i = 0; i < 3; i++) {
		out[i] = (int)strtol(q, &e, 10);
		if (e == q) {
			out[i] = 1;
			break;
		}
		q = e;
		while (*q == ' ' || *q == '\t')
			q++;
		if (*q != ',')
			break;
		q++;
	}
	return out[0] * out[1] * out[2];
}

static int ptx_type_size(const char *t)
{
	if (!strncmp(t, ".b8", 3) || !strncmp(t, ".u8", 3) || !strncmp(t, ".s8", 3))
		return 1;
	if (!strncmp(t, ".b16", 4) || !strncmp(t, ".u16", 4) || !strncmp(t, ".s16", 4) ||
	    !strncmp(t, ".f16", 4))
		return 2;
	if (!strncmp(t, ".b64", 4) || !strncmp(t, ".u64", 4) || !strncmp(t, ".s64", 4) ||
	    !strncmp(t, ".f64", 4))
		return 8;
	return 4;
}

/* Bytes of the sized .shared arrays declared in [p, end) (".extern"
 * arrays are dynamic: left out); with `uses` non-NULL only those whose
 * name occurs in it (module-scope arrays the entry's body names). */
static long ptx_shared(const char *p, const char *end, const char *uses, size_t uses_len)
{
	long total = 0;

	for (const char *q = strstr(p, ".shared "); q && q < end; q = strstr(q + 8, ".shared ")) {
		const char *line = q, *eol = strchr(q, ';'), *br, *nm;
		long n, es = 4;

		while (line > p && line[-1] != '\n')
			line--;
		if (!eol || eol > end || (strstr(line, ".extern") && strstr(line, ".extern") < q))
			continue;
		br = memchr(q, '[', (size_t)(eol - q));
		if (!br || br[1] == ']')
			continue;
		/* the element type: the last ".xN" word before the name */
		for (const char *t = q + 8; t < br; t++)
			if (*t == '.' && t[1] != 'a' && strncmp(t, ".shared", 7))
				es = ptx_type_size(t);
		for (nm = br; nm > q && nm[-1] != ' ' && nm[-1] != '\t'; nm--)
			;
		/* module scope: declared at the start of a line, named by the body */
		if (uses && (line != q || !memmem(uses, uses_len, nm, (size_t)(br - nm))))
			continue;
		n = es;
		for (const char *b = br; b && b < eol && *b == '[';) {
			n *= strtol(b + 1, NULL, 10);
			b = strchr(b, ']');
			b = b ? b + 1 : NULL;
		}
		total += n;
	}
	return total;
}

/* Parameters and directives of entry `name` of PTX text m; -2 when there
 * is no such entry. */
static int ptx_function(const char *m, const char *name, fake_fn *fn)
{
	const char *p = ptx_entry(m, name), *end, *body, *body_end;
	int d[3], n = 0, depth = 0;

	if (!p)
		return -2;
	end = strchr(p, ')');
	for (const char *q = strstr(p, ".param"); q && end && q < end; q = strstr(q + 6, ".param"))
		n++;
	body = end ? strchr(end, '{') : NULL;
	if (!body)
		return -2;
	for (body_end = body; *body_end; body_end++) {
		if (*body_end == '{')
			depth++;
		else if (*body_end == '}' && --depth == 0)
			break;
	}
	fn->n_params = n;
	if (ptx_dims(end, body, ".maxntid", d))
		fn->max_threads = d[0] * d[1] * d[2];
	if (ptx_dims(end, body, ".reqntid", d))
		fn->max_threads = d[0] * d[1] * d[2];
	if (ptx_dims(end, body, ".reqnctapercluster", d))
		memcpy(fn->cluster, d, sizeof(d));
	{
		const char *e = strstr(end, ".explicitcluster");
		fn->cluster_must = e && e < body;
	}
	fn->static_smem = (int)(ptx_shared(body, body_end, NULL, 0) +
				ptx_shared(m, p, body, (size_t)(body_end - body)));
	return n;
}

/* ---- cubin functions -------------------------------------------------------- */

static const Elf64_Shdr *cubin_section(const uint8_t *img, const char *name, Elf64_Shdr *out)
{
	Elf64_Ehdr h;
	Elf64_Shdr str;

	memcpy(&h, img, sizeof(h));
	if (h.e_shentsize != sizeof(Elf64_Shdr) || h.e_shstrndx >= h.e_shnum)
		return NULL;
	memcpy(&str, img + h.e_shoff + (size_t)h.e_shstrndx * sizeof(str), sizeof(str));
	for (unsigned i = 0; i < h.e_shnum; i++) {
		memcpy(out, img + h.e_shoff + (size_t)i * sizeof(*out), sizeof(*out));
		if (out->sh_name < str.sh_size &&
		    !strcmp((const char *)img + str.sh_offset + out->sh_name, name))
			return out;
	}
	return NULL;
}

/* The name of symbol `idx` of the cubin's .symtab, or "". */
static const char *cubin_symbol(const uint8_t *img, uint32_t idx)
{
	Elf64_Shdr st, str;
	Elf64_Ehdr h;
	Elf64_Sym s;

	memcpy(&h, img, sizeof(h));
	if (!cubin_section(img, ".symtab", &st) || st.sh_link >= h.e_shnum ||
	    (uint64_t)(idx + 1) * sizeof(s) > st.sh_size)
		return "";
	memcpy(&str, img + h.e_shoff + (size_t)st.sh_link * sizeof(str), sizeof(str));
	memcpy(&s, img + st.sh_offset + (size_t)idx * sizeof(s), sizeof(s));
	return s.st_name < str.sh_size ? (const char *)img + str.sh_offset + s.st_name : "";
}

/* Calls fn(attribute, payload, bytes) for each entry of an .nv.info
 * section: 4-byte records (format, attribute, 2 bytes) whose format 0x04
 * means that the 2 bytes are the size of a payload that follows. */
static void nv_info(const uint8_t *img, const Elf64_Shdr *s,
		    void (*fn)(void *, int, const uint8_t *, unsigned), void *user)
{
	const uint8_t *p = img + s->sh_offset, *end = p + s->sh_size;

	while (p + 4 <= end) {
		unsigned n = (unsigned)p[2] | (unsigned)p[3] << 8;

		if (p[0] == 0x04) {
			if (p + 4 + n > end)
				break;
			fn(user, p[1], p + 4, n);
			p += 4 + n;
		} else {
			fn(user, p[1], p + 2, 2);
			p += 4;
		}
	}
}

struct info_ctx { fake_fn *fn; const uint8_t *img; int kparams; };

/* EIATTR codes as NVRTC's cubins carry them: 0x05 the .maxntid dims,
 * 0x0a the parameter bank (symbol, then 16-bit offset and 16-bit size:
 * its size / 8 the parameters when all are 8-byte pointers), 0x17 one
 * parameter's record (KPARAM_INFO: counted, the parameters when a tensor
 * map of 128 bytes is among them), 0x3d the compile-time
 * cluster dims, 0x3e explicit cluster, 0x2f (in .nv.info) a function's
 * register count by symbol index. */
static void fn_info(void *user, int attr, const uint8_t *p, unsigned n)
{
	struct info_ctx *c = user;
	uint32_t v[3];

	if ((attr == 0x05 || attr == 0x3d) && n == 12) {
		memcpy(v, p, 12);
		if (attr == 0x05)
			c->fn->max_threads = (int)(v[0] * v[1] * v[2]);
		else
			for (int i = 0; i < 3; i++)
				c->fn->cluster[i] = (int)v[i];
	} else if (attr == 0x0a && n == 8) {
		memcpy(v, p, 8);
		c->fn->n_params = (int)(v[1] >> 16) / 8;
	} else if (attr == 0x3e) {
		c->fn->cluster_must = 1;
	} else if (attr == 0x17) {
		c->kparams++;
	}
}

static void regs_info(void *user, int attr, const uint8_t *p, unsigned n)
{
	struct info_ctx *c = user;
	uint32_t v[2];

	if (attr == 0x2f && n == 8) {
		memcpy(v, p, 8);
		if (!strcmp(cubin_symbol(c->img, v[0]), c->fn->name))
			c->fn->regs = (int)v[1];
	}
}

static int cubin_function(const fake_module *mod, const char *name, fake_fn *fn)
{
	char sec[160];
	Elf64_Shdr s;
	struct info_ctx c = { fn, mod->bin, 0 };

	snprintf(sec, sizeof(sec), ".text.%s", name);
	if (!cubin_section(mod->bin, sec, &s))
		return -2;
	snprintf(sec, sizeof(sec), ".nv.shared.%s", name);
	if (cubin_section(mod->bin, sec, &s))
		fn->static_smem = (int)s.sh_size;
	snprintf(sec, sizeof(sec), ".nv.info.%s", name);
	if (cubin_section(mod->bin, sec, &s))
		nv_info(mod->bin, &s, fn_info, &c);
	if (c.kparams > 0)
		fn->n_params = c.kparams;
	if (cubin_section(mod->bin, ".nv.info", &s))
		nv_info(mod->bin, &s, regs_info, &c);
	return 0;
}

int cuModuleGetFunction(void **f, void *m, const char *name)
{
	fake_module *mod = m;
	fake_fn tmp, *fn;

	memset(&tmp, 0, sizeof(tmp));
	strncpy(tmp.name, name, sizeof(tmp.name) - 1);
	tmp.max_threads = 1024;
	tmp.regs = 32;
	if (mod->kind == 'F') {
		if (strcmp(name, "add_one") || !strstr(mod->text, name))
			return E_NOT_FOUND;
		tmp.n_params = -1;
	} else if (mod->kind == 'P') {
		if (ptx_function(mod->text, name, &tmp) < 0)
			return E_NOT_FOUND;
	} else if (cubin_function(mod, name, &tmp) < 0) {
		return E_NOT_FOUND;
	}
	/* the default dynamic limit: 48 KiB less the static shared memory */
	tmp.max_dyn_smem = tmp.static_smem < 49152 ? 49152 - tmp.static_smem : 0;
	/* from a fixed pool (nothing to leak): a test gets few functions */
	{
		static fake_fn pool[256];
		static int used;

		if (used == 256)
			return E_OUT_OF_MEMORY;
		fn = &pool[used++];
	}
	*fn = tmp;
	*f = fn;
	return OK;
}

/* The function's thread limit: its .maxntid, and the registers a block
 * may hold (65536). */
static int fn_max_threads(const fake_fn *fn)
{
	int t = fn->max_threads < 1024 ? fn->max_threads : 1024;
	int by_regs = fn->regs > 0 ? 65536 / fn->regs / 32 * 32 : 1024;

	return t < by_regs ? t : by_regs;
}

int cuFuncGetAttribute(int *v, int a, void *f)
{
	const fake_fn *fn = f;

	switch (a) {
	case 0: *v = fn_max_threads(fn); return OK;
	case 1: *v = fn->static_smem; return OK;
	case 2: case 3: case 7: case 15: *v = 0; return OK;
	case 4: *v = fn->regs; return OK;
	case 5: *v = dev->sm; return OK;
	case 6: *v = dev->sm; return OK;
	case 8: *v = fn->max_dyn_smem; return OK;
	case 9: *v = -1; return OK;
	case 10: *v = fn->cluster_must; return OK;
	case 11: case 12: case 13: *v = fn->cluster[a - 11]; return OK;
	case 14: *v = fn->non_portable; return OK;
	default: return E_INVALID_VALUE;
	}
}

int cuFuncSetAttribute(void *f, int a, int v)
{
	fake_fn *fn = f;

	switch (a) {
	case 8:
		if (v < 0 || v > dev->smem_optin - fn->static_smem)
			return E_INVALID_VALUE;
		fn->max_dyn_smem = v;
		fake_smem_attr = v;
		return OK;
	case 9:
		return v >= -1 && v <= 100 ? OK : E_INVALID_VALUE;
	case 10:
		fn->cluster_must = v != 0;
		return OK;
	case 11: case 12: case 13:
		if (fn->cluster[0])
			return E_NOT_PERMITTED;   /* compile-time dims */
		return E_INVALID_VALUE;
	case 14:
		fn->non_portable = v != 0;
		return OK;
	default:
		return E_INVALID_VALUE;
	}
}

/* ---- memory ----------------------------------------------------------------- */

int cuMemAlloc_v2(dptr *p, size_t n)
{
	void *q = NULL;

	if (fault_sticky)
		return E_ILLEGAL_ADDRESS;
	if (posix_memalign(&q, 256, n ? n : 1))
		return E_OUT_OF_MEMORY;
	*p = (dptr)(uintptr_t)q;
	fake_allocs++;
	return OK;
}

int cuMemFree_v2(dptr p) { free((void *)(uintptr_t)p); fake_allocs--; return OK; }

int cuMemcpyHtoD_v2(dptr d, const void *s, size_t n)
{
	int r = sync_point();

	if (r)
		return r;
	memcpy((void *)(uintptr_t)d, s, n);
	memop('H', d, n, NULL);
	return OK;
}

int cuMemcpyDtoH_v2(void *d, dptr s, size_t n)
{
	int r = sync_point();

	if (r)
		return r;
	memcpy(d, (void *)(uintptr_t)s, n);
	memop('D', s, n, NULL);
	return OK;
}

int cuMemsetD8_v2(dptr d, unsigned char v, size_t n)
{
	int r = sync_point();

	if (r)
		return r;
	memset((void *)(uintptr_t)d, v, n);
	memop('S', d, n, NULL);
	fake_sync_memsets++;
	return OK;
}

int cuMemsetD8Async(dptr d, unsigned char v, size_t n, void *st)
{
	if (fault_sticky)
		return E_ILLEGAL_ADDRESS;
	memset((void *)(uintptr_t)d, v, n);
	memop('A', d, n, st);
	return OK;
}

/* ---- launches ------------------------------------------------------------------ */

static int launch_check(const fake_fn *fn, const unsigned g[3], const unsigned b[3], unsigned smem)
{
	static const unsigned max_grid[3] = { 2147483647u, 65535, 65535 };
	static const unsigned max_block[3] = { 1024, 1024, 64 };
	unsigned long long threads = (unsigned long long)b[0] * b[1] * b[2];
	int cl = fn->cluster[0] * fn->cluster[1] * fn->cluster[2];

	for (int i = 0; i < 3; i++)
		if (!g[i] || !b[i] || g[i] > max_grid[i] || b[i] > max_block[i])
			return E_INVALID_VALUE;
	if (threads > 1024)
		return E_INVALID_VALUE;
	if (threads > (unsigned long long)fn_max_threads(fn))
		return E_LAUNCH_OUT_OF_RESOURCES;
	if (smem > (unsigned)fn->max_dyn_smem)
		return E_INVALID_VALUE;
	if (fn->cluster[0]) {
		if (!dev->cluster || cl > (fn->non_portable ? 16 : 8))
			return E_INVALID_CLUSTER_SIZE;
		for (int i = 0; i < 3; i++)
			if (g[i] % (unsigned)fn->cluster[i])
				return E_INVALID_CLUSTER_SIZE;
	} else if (fn->cluster_must) {
		return E_INVALID_CLUSTER_SIZE;   /* cuLaunchKernel gives no cluster */
	}
	return OK;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
		   unsigned bz, unsigned smem, void *st, void **p, void **extra)
{
	fake_fn *fn = f;
	const unsigned g[3] = { gx, gy, gz }, b[3] = { bx, by, bz };
	const char *fault = getenv("APOLLO_STANDIN_FAULT");
	int r;

	(void)extra;
	if (fault_sticky)
		return E_ILLEGAL_ADDRESS;
	if ((r = launch_check(fn, g, b, smem)) != OK)
		return fake_last_error = r;
	fake_grid[0] = gx; fake_grid[1] = gy; fake_grid[2] = gz;
	fake_block[0] = bx; fake_block[1] = by; fake_block[2] = bz;
	fake_smem = smem;
	fake_last_stream = st;
	if (fn->n_params < 0) {
		float *x = (float *)(uintptr_t)*(dptr *)p[0], *y = (float *)(uintptr_t)*(dptr *)p[1];
		unsigned n = gx * gy * gz * bx * by * bz;

		for (unsigned i = 0; i < n; i++)
			y[i] = x[i] + 1;
	}
	if (fake_log_n < FAKE_LOG) {
		fake_launch *l = &fake_log[fake_log_n];

		memset(l, 0, sizeof(*l));
		strncpy(l->kernel, fn->name, sizeof(l->kernel) - 1);
		l->grid[0] = gx; l->grid[1] = gy; l->grid[2] = gz;
		l->block[0] = bx; l->block[1] = by; l->block[2] = bz;
		l->smem = smem;
		l->stream = st;
		l->n_params = fn->n_params < 0 ? 2 : fn->n_params;
		for (int i = 0; i < l->n_params && i < FAKE_MAX_PARAMS; i++)
			l->params[i] = *(dptr *)p[i];
		fake_launch_seq[fake_log_n++] = ++fake_seq;
	}
	fake_launches++;
	if (fault && *fault && atoi(fault) == fake_launches) {
		fault_pending = 1;   /* found by the next synchronising call */
		fake_faults++;
	}
	fake_clock_ms += fake_launch_ms(gx * gy * gz, bx * by * bz, smem);
	return OK;
}

/* cuTensorMapEncodeTiled: the map address 64-byte aligned and what
 * ap_tmap_check accepts (the Driver API's rules), else
 * CUDA_ERROR_INVALID_VALUE; the "encoding" is the stand-in's own -- the
 * global address in w[0], the rank in w[1], the dims from w[2] -- and the
 * calls are counted and the last one's description kept. */
int fake_tmap_encodes;
ap_tmap_desc fake_tmap_last;
unsigned long long fake_tmap_last_addr;

int cuTensorMapEncodeTiled(void *map, int dtype, uint32_t rank, void *addr, const uint64_t *dims,
			   const uint64_t *strides, const uint32_t *box, const uint32_t *estrides, int interleave,
			   int swizzle, int l2, int oob)
{
	ap_tmap_desc d = { .dtype = dtype, .rank = (int)rank, .interleave = interleave, .swizzle = swizzle,
			   .l2 = l2, .oob = oob };
	unsigned long long *w = map;

	if (!map || (uintptr_t)map % 64 || rank < 1 || rank > AP_TMAP_MAX_RANK || !dims || !box || !estrides ||
	    (rank > 1 && !strides))
		return E_INVALID_VALUE;
	for (uint32_t i = 0; i < rank; i++) {
		d.dims[i] = dims[i];
		d.box[i] = box[i];
		d.estrides[i] = estrides[i];
		if (i + 1 < rank)
			d.strides[i] = strides[i];
	}
	if (ap_tmap_check(&d, addr, NULL, 0))
		return E_INVALID_VALUE;
	memset(w, 0, 128);
	w[0] = (unsigned long long)(uintptr_t)addr;
	w[1] = rank;
	for (uint32_t i = 0; i < rank && i < 14; i++)
		w[2 + i] = dims[i];
	fake_tmap_encodes++;
	fake_tmap_last = d;
	fake_tmap_last_addr = (unsigned long long)(uintptr_t)addr;
	return OK;
}

int cuGetErrorString(int r, const char **s)
{
	switch (r) {
	case E_INVALID_VALUE: *s = "invalid argument (stand-in driver)"; break;
	case E_INVALID_IMAGE: *s = "device kernel image is invalid (stand-in driver)"; break;
	case E_NO_BINARY_FOR_GPU: *s = "no kernel image is available for execution on the device (stand-in driver)"; break;
	case E_INVALID_PTX: *s = "a PTX JIT compilation failed (stand-in driver)"; break;
	case E_NOT_FOUND: *s = "named symbol not found (stand-in driver)"; break;
	case E_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered (stand-in driver)"; break;
	case E_LAUNCH_OUT_OF_RESOURCES: *s = "too many resources requested for launch (stand-in driver)"; break;
	case E_INVALID_CLUSTER_SIZE: *s = "invalid cluster size (stand-in driver)"; break;
	default: *s = "fake driver error"; break;
	}
	return OK;
}

int cuGetErrorName(int r, const char **s)
{
	switch (r) {
	case E_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
	case E_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
	case E_NO_BINARY_FOR_GPU: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
	case E_INVALID_PTX: *s = "CUDA_ERROR_INVALID_PTX"; break;
	case E_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
	case E_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
	case E_LAUNCH_OUT_OF_RESOURCES: *s = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; break;
	case E_INVALID_CLUSTER_SIZE: *s = "CUDA_ERROR_INVALID_CLUSTER_SIZE"; break;
	default: return E_INVALID_VALUE;
	}
	return OK;
}

/* Device facts, and events on a made-up device clock that each launch
 * advances by a time fixed by its shape -- 2 us + 1 us per 1024 threads +
 * 1 us per 4 KiB of dynamic shared memory -- so that timings are
 * deterministic and differ between configurations (apollo-client tune's
 * test predicts the winner from the launch log). */
double fake_clock_ms;
int fake_events;

int cuDeviceGetName(char *name, int len, int d)
{
	(void)d;
	strncpy(name, dev->name, (size_t)len);
	return OK;
}

int cuDeviceGetAttribute(int *v, int attr, int d)
{
	(void)d;
	switch (attr) {
	case 1: case 2: case 3: *v = 1024; break;          /* threads, block x, y */
	case 4: *v = 64; break;                            /* block z */
	case 5: *v = 2147483647; break;                    /* grid x */
	case 6: case 7: *v = 65535; break;                 /* grid y, z */
	case 8: *v = 49152; break;                         /* shared per block */
	case 12: case 82: *v = 65536; break;               /* registers per block, per SM */
	case 16: *v = dev->sms; break;
	case 75: *v = dev->sm / 10; break;
	case 76: *v = dev->sm % 10; break;
	case 81: *v = dev->smem_sm; break;
	case 97: *v = dev->smem_optin; break;
	case 120: *v = dev->cluster; break;
	default: *v = 0; break;
	}
	return OK;
}

int cuEventCreate(void **e, unsigned flags)
{
	(void)flags;
	*e = calloc(1, sizeof(double));
	fake_events++;
	return *e ? OK : E_OUT_OF_MEMORY;
}

int cuEventDestroy_v2(void *e) { free(e); fake_events--; return OK; }

int cuEventRecord(void *e, void *st)
{
	if (fault_sticky)
		return E_ILLEGAL_ADDRESS;
	*(double *)e = fake_clock_ms;
	memop('R', 0, 0, st);
	return OK;
}

int cuEventSynchronize(void *e) { (void)e; return sync_point(); }

int cuStreamWaitEvent(void *st, void *e, unsigned flags)
{
	(void)e;
	(void)flags;
	if (fault_sticky)
		return E_ILLEGAL_ADDRESS;
	memop('W', 0, 0, st);
	return OK;
}

int cuEventElapsedTime(float *ms, void *a, void *b)
{
	*ms = (float)(*(double *)b - *(double *)a);
	return OK;
}

double fake_launch_ms(unsigned blocks, unsigned threads, unsigned smem)
{
	return (2.0 + (double)blocks * threads / 1024.0 + smem / 4096.0) / 1000.0;
}
