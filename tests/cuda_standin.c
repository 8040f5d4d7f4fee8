/* cuda_standin.c -- a stand-in CUDA driver (libcuda.so.1) for machines
 * without a GPU, built as build/tests/libcuda-standin.so and loaded by the
 * runtime through $APOLLO_LIBCUDA.  Device memory is host memory; a module
 * is its image text.  Two kinds of image:
 *   "FAKEPTX ..." naming kernels: add_one adds 1 to every float of its
 *   first argument into its second (check_runtime's hand-made bundles);
 *   real PTX (".version", ".entry NAME(" with ".param" lines): each entry
 *   is found and its parameters counted, and a launch is only recorded --
 *   kernel, grid, block, dynamic shared bytes, stream and every parameter's
 *   value (the device addresses bound) -- so the plumbing of a real bundle
 *   (modules, functions, bindings, the caller's stream) is checked.
 * Counters and the launch log are exported for tests (dlsym, ctypes).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long dptr;

#define FAKE_LOG 4096
#define FAKE_MAX_PARAMS 64

typedef struct fake_launch {
	char kernel[128];
	unsigned grid[3], block[3], smem;
	void *stream;
	int n_params;
	dptr params[FAKE_MAX_PARAMS];
} fake_launch;

typedef struct fake_fn {
	char name[128];
	int n_params;     /* -1: add_one */
} fake_fn;

double fake_launch_ms(unsigned blocks, unsigned threads, unsigned smem);
extern double fake_clock_ms;
int fake_launches, fake_allocs, fake_smem_attr, fake_ctx, fake_modules;
unsigned fake_grid[3], fake_block[3], fake_smem;
size_t fake_image_len;
void *fake_last_stream;
int fake_log_n;
fake_launch fake_log[FAKE_LOG];

int cuInit(unsigned f) { (void)f; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int o) { if (o) return 101; *d = 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; fake_ctx++; *c = (void *)1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { (void)d; fake_ctx--; return 0; }
int cuCtxSetCurrent(void *c) { return c == (void *)1 ? 0 : 201; }
int cuCtxSynchronize(void) { return 0; }

int cuModuleLoadData(void **m, const void *img)
{
	if (strncmp(img, "FAKEPTX", 7) && !strstr(img, ".version"))
		return 200;
	fake_image_len = strlen(img);
	*m = strdup(img);
	fake_modules++;
	return *m ? 0 : 2;
}

int cuModuleUnload(void *m) { free(m); fake_modules--; return 0; }

/* Parameters of entry `name` in PTX text m: the ".param" lines between
 * ".entry name(" and ")"; -2 when there is no such entry. */
static int ptx_params(const char *m, const char *name)
{
	const char *p = m;
	size_t len = strlen(name);

	while ((p = strstr(p, ".entry ")) != NULL) {
		p += 7;
		while (*p == ' ')
			p++;
		if (!strncmp(p, name, len) && (p[len] == '(' || p[len] == ' ' || p[len] == '\n')) {
			const char *end = strchr(p, ')');
			int n = 0;

			for (const char *q = strstr(p, ".param"); q && end && q < end; q = strstr(q + 6, ".param"))
				n++;
			return n;
		}
	}
	return -2;
}

int cuModuleGetFunction(void **f, void *m, const char *name)
{
	fake_fn *fn;
	int n;

	if (!strncmp(m, "FAKEPTX", 7)) {
		if (strcmp(name, "add_one") || !strstr(m, name))
			return 500;
		n = -1;
	} else if ((n = ptx_params(m, name)) < 0) {
		return 500;
	}
	/* from a fixed pool (nothing to leak): a test gets few functions */
	{
		static fake_fn pool[256];
		static int used;

		if (used == 256)
			return 2;
		fn = &pool[used++];
		memset(fn, 0, sizeof(*fn));
	}
	strncpy(fn->name, name, sizeof(fn->name) - 1);
	fn->n_params = n;
	*f = fn;
	return 0;
}

int cuFuncSetAttribute(void *f, int a, int v) { (void)f; if (a == 8) fake_smem_attr = v; return 0; }

int cuMemAlloc_v2(dptr *p, size_t n)
{
	void *q = NULL;

	if (posix_memalign(&q, 256, n ? n : 1))
		return 2;
	*p = (dptr)(uintptr_t)q;
	fake_allocs++;
	return 0;
}

int cuMemFree_v2(dptr p) { free((void *)(uintptr_t)p); fake_allocs--; return 0; }
int cuMemcpyHtoD_v2(dptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return 0; }
int cuMemcpyDtoH_v2(void *d, dptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return 0; }
int cuMemsetD8_v2(dptr d, unsigned char v, size_t n) { memset((void *)(uintptr_t)d, v, n); return 0; }

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
		   unsigned bz, unsigned smem, void *st, void **p, void **extra)
{
	fake_fn *fn = f;

	(void)extra;
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
		fake_launch *l = &fake_log[fake_log_n++];

		memset(l, 0, sizeof(*l));
		strncpy(l->kernel, fn->name, sizeof(l->kernel) - 1);
		l->grid[0] = gx; l->grid[1] = gy; l->grid[2] = gz;
		l->block[0] = bx; l->block[1] = by; l->block[2] = bz;
		l->smem = smem;
		l->stream = st;
		l->n_params = fn->n_params < 0 ? 2 : fn->n_params;
		for (int i = 0; i < l->n_params && i < FAKE_MAX_PARAMS; i++)
			l->params[i] = *(dptr *)p[i];
	}
	fake_launches++;
	fake_clock_ms += fake_launch_ms(gx * gy * gz, bx * by * bz, smem);
	return 0;
}

int cuGetErrorString(int r, const char **s) { (void)r; *s = "fake driver error"; return 0; }

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
	strncpy(name, "Apollo stand-in GPU", (size_t)len);
	return 0;
}

int cuDeviceGetAttribute(int *v, int attr, int d)
{
	(void)d;
	*v = attr == 16 ? 132 : 0;   /* MULTIPROCESSOR_COUNT */
	return 0;
}

int cuEventCreate(void **e, unsigned flags)
{
	(void)flags;
	*e = calloc(1, sizeof(double));
	fake_events++;
	return *e ? 0 : 2;
}

int cuEventDestroy_v2(void *e) { free(e); fake_events--; return 0; }
int cuEventRecord(void *e, void *st) { (void)st; *(double *)e = fake_clock_ms; return 0; }
int cuEventSynchronize(void *e) { (void)e; return 0; }

int cuEventElapsedTime(float *ms, void *a, void *b)
{
	*ms = (float)(*(double *)b - *(double *)a);
	return 0;
}

double fake_launch_ms(unsigned blocks, unsigned threads, unsigned smem)
{
	return (2.0 + (double)blocks * threads / 1024.0 + smem / 4096.0) / 1000.0;
}
