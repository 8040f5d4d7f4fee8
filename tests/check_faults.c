/* check_faults.c -- fault injection, after SQLite's own test harness:
 * every allocation and every cache I/O operation on the request path is
 * made to fail in turn, and each failure must end in a clean error (never a
 * crash, never a wrong answer), leak nothing (LeakSanitizer, in `make
 * check-asan`, runs this suite too) and leave the cache intact.
 *
 * Allocations: this suite is linked with -Wl,--wrap=malloc,calloc,realloc,
 * strdup (Makefile), so every allocation Apollo's own code makes goes
 * through __wrap_* below, and protobuf decoding through ap_pb_budget (the
 * daemon's decoder) does too.  fa_run(N) fails the Nth allocation from
 * the moment it is armed, once; a driver runs the same operation for
 * N = 1, 2, ... until one completes without reaching N, and checks each
 * result: an error code with a message, or exactly the reference answer.
 * Drivers: the Envelope + Graph decoder with validation and both hashes;
 * the ONNX importer; ap_program_build (expansion, partition, lowering,
 * printing, plan); the compile job (ap_compile_run, kernels from the
 * kernel cache), each over bert_like_2l (a 2-layer transformer: MatMul,
 * Softmax, LayerNorm, Gelu, Reshape, Transpose...).  Every N is tried up
 * to FA_DENSE (all of them today: a few thousand each), then a spread of
 * FA_SPREAD more (APOLLO_FAULTS_ALL=1 tries every N).
 *
 * Cache I/O: an SQLite VFS shim over the default one fails the Nth read,
 * write, sync, truncate or shared-memory mapping with an SQLITE_IOERR_*
 * code.  The workload (reads and writes through ap_cache, and whole
 * compile requests) must go on (a failing cache only turns itself off),
 * and afterwards the file must pass PRAGMA integrity_check and still hold
 * every entry committed before the fault.
 */
#include <check.h>
#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/apollo.h"
#include "common/graph.h"
#include "common/pb_budget.h"
#include "proto/apollo.pb-c.h"
#include "proto/onnx.pb-c.h"
#include "server/cache/cache.h"
#include "server/compile/compile.h"
#include "server/config.h"
#include "server/plan/program.h"

#define FA_DENSE 20000
#define FA_SPREAD 5000

/* ---- the allocation hook ---------------------------------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);

static atomic_long fa_count;     /* allocations since armed */
static atomic_long fa_target;    /* the one to fail; 0 = none */
static atomic_bool fa_armed, fa_hit;

static bool fa_fail(void)
{
	long n;

	if (!atomic_load(&fa_armed))
		return false;
	n = atomic_fetch_add(&fa_count, 1) + 1;
	if (n == atomic_load(&fa_target)) {
		atomic_store(&fa_hit, true);
		return true;
	}
	return false;
}

void *__wrap_malloc(size_t n)
{
	return fa_fail() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return fa_fail() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
	return fa_fail() ? NULL : __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
	return fa_fail() ? NULL : __real_strdup(s);
}

/* Arms the hook to fail allocation `target` (0: count only).
 * $APOLLO_FAULTS_TRACE prints each target first (to find a crash). */
static void fa_arm(long target)
{
	if (getenv("APOLLO_FAULTS_TRACE")) {
		fprintf(stderr, "fail allocation %ld\n", target);
		fflush(stderr);
	}
	atomic_store(&fa_count, 0);
	atomic_store(&fa_target, target);
	atomic_store(&fa_hit, false);
	atomic_store(&fa_armed, true);
}

/* Disarms; returns the allocations seen. */
static long fa_disarm(void)
{
	atomic_store(&fa_armed, false);
	return atomic_load(&fa_count);
}

/* The N to try for an operation of `total` allocations. */
static long fa_next(long n, long total)
{
	long step;

	if (getenv("APOLLO_FAULTS_ALL") || n < FA_DENSE)
		return n + 1;
	step = (total - FA_DENSE) / FA_SPREAD;
	return n + (step > 1 ? step : 1);
}

/* ---- inputs ------------------------------------------------------------------- */

static uint8_t *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(fread(buf, 1, (size_t)n, f), n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static uint8_t *model_bytes(const char *rel, size_t *len)
{
	const char *td = getenv("APOLLO_TESTDATA");
	char path[1024];

	snprintf(path, sizeof(path), "%s/%s/model.onnx", td && *td ? td : "../shared/testdata", rel);
	return read_file(path, len);
}

/* A graph imported from the testdata model `rel` (validated). */
static ap_graph *model_graph(const char *rel)
{
	size_t len = 0;
	uint8_t *buf = model_bytes(rel, &len);
	ap_error err;
	ap_graph *g;

	ck_assert_msg(buf != NULL, "no test data %s (set APOLLO_TESTDATA)", rel);
	g = ap_onnx_import(buf, len, NULL, 0, NULL, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	free(buf);
	return g;
}

/* Packed Envelope { compile { graph } } of g. */
static uint8_t *envelope_bytes(const ap_graph *g, size_t *len)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__Graph *pb = ap_graph_to_pb(g);
	uint8_t *buf;

	ck_assert_ptr_nonnull(pb);
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = pb;
	req.target = "cpu";
	env.msg_case = APOLLO__ENVELOPE__MSG_COMPILE;
	env.compile = &req;
	*len = apollo__envelope__get_packed_size(&env);
	buf = malloc(*len);
	ck_assert_ptr_nonnull(buf);
	apollo__envelope__pack(&env, buf);
	ap_graph_pb_free(pb);
	return buf;
}

/* A failed allocation must read as one: AP_ENOMEM with a message, not a
 * misleading "invalid graph" or "does not decode". */
static void check_error(const char *what, long n, int rc, const ap_error *err)
{
	ck_assert_msg(rc == AP_ENOMEM, "%s, allocation %ld failed: rc %d (%s)", what, n, rc,
		      err->msg);
	ck_assert_msg(err->code == rc && err->msg[0], "%s, allocation %ld: error %d without a message",
		      what, n, rc);
}

/* ---- drivers ------------------------------------------------------------------ */

/* The daemon's decoder: Envelope (within its budget) -> graph -> validate
 * -> structural and named hashes. */
static int decode(const uint8_t *buf, size_t len, uint8_t h[32], uint8_t hn[32], ap_error *err)
{
	ap_pb_budget b;
	Apollo__Envelope *env;
	ap_graph *g;
	int rc;

	ap_error_clear(err);
	ap_pb_budget_init(&b, ap_pb_decode_limit(len, 16, (size_t)4 << 20));
	env = apollo__envelope__unpack(&b.allocator, len, buf);
	if (!env)
		return ap_error_set(err, b.exceeded ? AP_ETOOLARGE : b.out_of_memory ? AP_ENOMEM
									    : AP_EMESSAGE,
				    NULL, NULL, "does not decode");
	g = ap_graph_from_pb(env->compile->graph, err);
	apollo__envelope__free_unpacked(env, NULL);
	if (!g)
		return err->code;
	rc = ap_graph_validate(g, err);
	if (!rc && (ap_graph_hash(g, h) || ap_graph_hash_named(g, hn)))
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory hashing");
	ap_graph_free(g);
	return rc;
}

START_TEST(decoder_allocation_failures)
{
	ap_graph *g = model_graph("models/bert_like_2l");
	uint8_t ref[32], refn[32], h[32], hn[32];
	size_t len;
	uint8_t *buf = envelope_bytes(g, &len);
	ap_error err;
	long total, tried = 0;

	fa_arm(0);
	ck_assert_int_eq(decode(buf, len, ref, refn, &err), 0);
	total = fa_disarm();
	for (long n = 1;; n = fa_next(n, total)) {
		int rc;

		fa_arm(n);
		rc = decode(buf, len, h, hn, &err);
		fa_disarm();
		tried++;
		if (!atomic_load(&fa_hit)) {
			ck_assert_int_eq(rc, 0);
			break;
		}
		if (rc == 0) {   /* a failure absorbed: the answer must be the same */
			ck_assert_msg(!memcmp(h, ref, 32) && !memcmp(hn, refn, 32),
				      "allocation %ld failed and the hash changed", n);
			continue;
		}
		check_error("decoder", n, rc, &err);
	}
	printf("decoder_allocation_failures: %ld allocations, %ld tried\n", total, tried);
	free(buf);
	ap_graph_free(g);
}
END_TEST

START_TEST(importer_allocation_failures)
{
	size_t len = 0;
	uint8_t *buf = model_bytes("models/bert_like_2l", &len);
	uint8_t ref[32], h[32];
	ap_error err;
	ap_params *params = NULL;
	ap_graph *g;
	long total, tried = 0;

	ck_assert_ptr_nonnull(buf);
	fa_arm(0);
	g = ap_onnx_import(buf, len, NULL, 0, &params, &err);
	total = fa_disarm();
	ck_assert_ptr_nonnull(g);
	ck_assert_int_eq(ap_graph_hash_named(g, ref), 0);
	ap_graph_free(g);
	ap_params_free(params);
	for (long n = 1;; n = fa_next(n, total)) {
		params = NULL;
		fa_arm(n);
		g = ap_onnx_import(buf, len, NULL, 0, &params, &err);
		fa_disarm();
		tried++;
		if (g) {
			ck_assert_int_eq(ap_graph_hash_named(g, h), 0);
			ck_assert_msg(!memcmp(h, ref, 32), "allocation %ld failed and the graph changed",
				      n);
			ap_graph_free(g);
			ap_params_free(params);
			if (!atomic_load(&fa_hit))
				break;
			continue;
		}
		ck_assert_msg(atomic_load(&fa_hit), "import failed without a fault: %s", err.msg);
		ck_assert_ptr_null(params);
		check_error("importer", n, err.code, &err);
	}
	printf("importer_allocation_failures: %ld allocations, %ld tried\n", total, tried);
	free(buf);
}
END_TEST

/* The kernels' host sources, in order, as one comparable string. */
static char *program_text(const ap_program *p)
{
	size_t n = 64;
	char *s;

	for (int k = 0; k < p->n_kernels; k++)
		n += strlen(p->kernels[k].src) + strlen(p->kernels[k].name) + 2;
	s = malloc(n);
	ck_assert_ptr_nonnull(s);
	snprintf(s, n, "%d launches %d buffers\n", p->n_launches, p->n_buffers);
	for (int k = 0; k < p->n_kernels; k++) {
		strcat(s, p->kernels[k].name);
		strcat(s, "\n");
		strcat(s, p->kernels[k].src);
	}
	return s;
}

START_TEST(program_allocation_failures)
{
	ap_graph *g = model_graph("models/bert_like_2l");
	ap_error err;
	ap_program *p;
	char *ref;
	long total, tried = 0;

	fa_arm(0);
	p = ap_program_build(g, NULL, &err);
	total = fa_disarm();
	ck_assert_msg(p != NULL, "%s", err.msg);
	ref = program_text(p);
	ap_program_free(p);
	for (long n = 1;; n = fa_next(n, total)) {
		ap_error_clear(&err);
		fa_arm(n);
		p = ap_program_build(g, NULL, &err);
		fa_disarm();
		tried++;
		if (p) {
			char *t = program_text(p);
			ck_assert_msg(!strcmp(t, ref), "allocation %ld failed and the program changed", n);
			free(t);
			ap_program_free(p);
			if (!atomic_load(&fa_hit))
				break;
			continue;
		}
		ck_assert_msg(atomic_load(&fa_hit), "build failed without a fault: %s", err.msg);
		check_error("program", n, err.code, &err);
	}
	printf("program_allocation_failures: %ld allocations, %ld tried\n", total, tried);
	free(ref);
	ap_graph_free(g);
}
END_TEST

/* ---- the compile job ------------------------------------------------------------ */

static char tmpdir[64];

static void make_tmpdir(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/apollo-faults-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	ap_log_set_level(AP_LOG_ERROR);
}

static void remove_tmpdir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", tmpdir);
}

/* Compiles `pb` (target cpu) in namespace `ns`: the bundle's shape as text
 * (with *code 0), or an error code and message.  The text is allocated
 * after the compile, outside any armed fault. */
static char *compile_text(ap_compiler *c, Apollo__Graph *pb, const char *ns, int *code, char *msg,
			  size_t cap)
{
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__CompileOptions o = APOLLO__COMPILE_OPTIONS__INIT;
	Apollo__CompileResponse *r;
	bool armed = atomic_load(&fa_armed);
	char *t;

	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = pb;
	req.target = "cpu";
	o.cache_namespace = (char *)ns;
	req.options = &o;
	r = ap_compile_run(c, &req);
	atomic_store(&fa_armed, false);
	t = calloc(1, 4096);
	ck_assert_ptr_nonnull(t);
	*code = 0;
	if (!r) {
		*code = AP_ENOMEM;   /* the daemon answers "out of memory" itself */
		snprintf(msg, cap, "no response (out of memory)");
	} else if (r->result_case == APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE) {
		const Apollo__Bundle *b = r->bundle;
		size_t used = (size_t)snprintf(t, 4096, "%zu kernels %zu launches %zu buffers\n",
					       b->n_kernels, b->n_plan, b->n_buffers);
		for (size_t k = 0; k < b->n_kernels && used < 4000; k++)
			used += (size_t)snprintf(t + used, 4096 - used, "%s %zu\n", b->kernels[k]->name,
						 b->kernels[k]->n_params);
	} else {
		*code = ap_client_error_from_wire((int)r->error->code);
		snprintf(msg, cap, "%s", r->error->message ? r->error->message : "");
	}
	ap_compile_response_free(r);
	atomic_store(&fa_armed, armed);
	return t;
}

/* Two graphs take turns under every N: an answer given for one graph to
 * the other (say, both keyed alike when a key could not be computed) is
 * caught as a changed bundle. */
START_TEST(compile_allocation_failures)
{
	static const char *const models[2] = { "models/bert_like_2l", "models/mlp_gelu_ln" };
	ap_graph *gr[2];
	Apollo__Graph *g[2];
	char path[128], ns[32], msg[512], *ref[2], *t;
	ap_compiler_options co = { .threads = 1 };
	ap_compiler *c;
	ap_cache *cache = NULL;
	ap_error err;
	long total = 0, tried = 0;
	int code;

	make_tmpdir();
	snprintf(path, sizeof(path), "%s/cache.db", tmpdir);
	ck_assert_int_eq(ap_cache_open(path, &cache, &err), 0);
	c = ap_compiler_new(cache, &co);
	ck_assert_ptr_nonnull(c);
	for (int m = 0; m < 2; m++) {
		gr[m] = model_graph(models[m]);
		g[m] = ap_graph_to_pb(gr[m]);
		/* the reference also fills the kernel cache: later runs compile nothing */
		ref[m] = compile_text(c, g[m], "ref", &code, msg, sizeof(msg));
		ck_assert_msg(code == 0, "%s", msg);
		free(compile_text(c, g[m], "warm", &code, msg, sizeof(msg)));
		fa_arm(0);
		free(compile_text(c, g[m], "count", &code, msg, sizeof(msg)));
		if (fa_disarm() > total)
			total = fa_disarm();
	}
	for (long n = 1;; n = fa_next(n, total)) {
		bool hit = false;

		for (int m = 0; m < 2; m++) {
			snprintf(ns, sizeof(ns), "n%ld", n);   /* a miss in the action cache */
			fa_arm(n);
			t = compile_text(c, g[m], ns, &code, msg, sizeof(msg));
			fa_disarm();
			tried++;
			hit |= atomic_load(&fa_hit);
			if (code == 0) {
				ck_assert_msg(!strcmp(t, ref[m]),
					      "allocation %ld failed and the bundle of %s changed:\n%s", n,
					      models[m], t);
			} else {
				ck_assert_msg(atomic_load(&fa_hit), "compile failed without a fault: %s",
					      msg);
				ck_assert_msg(strstr(msg, "out of memory") != NULL,
					      "allocation %ld: a misleading error: %s", n, msg);
			}
			free(t);
		}
		if (!hit)
			break;
	}
	printf("compile_allocation_failures: %ld allocations, %ld tried\n", total, tried);
	for (int m = 0; m < 2; m++) {   /* the cache still answers */
		t = compile_text(c, g[m], "ref", &code, msg, sizeof(msg));
		ck_assert_str_eq(t, ref[m]);
		free(t);
		free(ref[m]);
		ap_graph_pb_free(g[m]);
		ap_graph_free(gr[m]);
	}
	ap_compiler_free(c);
	ap_cache_free(cache);
	remove_tmpdir();
}
END_TEST

/* ---- the SQLite I/O shim ------------------------------------------------------------ */

static sqlite3_vfs shim_vfs, *real_vfs;
static atomic_long io_count, io_target;
static atomic_bool io_armed, io_hit;

typedef struct shim_file {
	sqlite3_file base;
	sqlite3_file *real;   /* follows this struct */
} shim_file;

static bool io_fail(void)
{
	long n;

	if (!atomic_load(&io_armed))
		return false;
	n = atomic_fetch_add(&io_count, 1) + 1;
	if (n == atomic_load(&io_target)) {
		atomic_store(&io_hit, true);
		return true;
	}
	return false;
}

#define REAL(f) (((shim_file *)(f))->real)

static int shim_close(sqlite3_file *f)
{
	return REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
}
static int shim_read(sqlite3_file *f, void *buf, int n, sqlite3_int64 off)
{
	return io_fail() ? SQLITE_IOERR_READ : REAL(f)->pMethods->xRead(REAL(f), buf, n, off);
}
static int shim_write(sqlite3_file *f, const void *buf, int n, sqlite3_int64 off)
{
	return io_fail() ? SQLITE_IOERR_WRITE : REAL(f)->pMethods->xWrite(REAL(f), buf, n, off);
}
static int shim_truncate(sqlite3_file *f, sqlite3_int64 size)
{
	return io_fail() ? SQLITE_IOERR_TRUNCATE : REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int shim_sync(sqlite3_file *f, int flags)
{
	return io_fail() ? SQLITE_IOERR_FSYNC : REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int shim_size(sqlite3_file *f, sqlite3_int64 *size)
{
	return io_fail() ? SQLITE_IOERR_FSTAT : REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int shim_lock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xLock(REAL(f), l); }
static int shim_unlock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xUnlock(REAL(f), l); }
static int shim_check_lock(sqlite3_file *f, int *out)
{
	return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int shim_control(sqlite3_file *f, int op, void *arg)
{
	return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int shim_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int shim_chars(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int shim_shm_map(sqlite3_file *f, int pg, int sz, int extend, void volatile **p)
{
	return io_fail() ? SQLITE_IOERR_SHMMAP
			 : REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, extend, p);
}
static int shim_shm_lock(sqlite3_file *f, int off, int n, int flags)
{
	return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void shim_shm_barrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int shim_shm_unmap(sqlite3_file *f, int del)
{
	return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}

static const sqlite3_io_methods shim_io = {
	2, shim_close, shim_read, shim_write, shim_truncate, shim_sync, shim_size, shim_lock,
	shim_unlock, shim_check_lock, shim_control, shim_sector, shim_chars, shim_shm_map,
	shim_shm_lock, shim_shm_barrier, shim_shm_unmap, NULL, NULL,
};

static int shim_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out)
{
	shim_file *sf = (shim_file *)f;
	int rc;

	sf->real = (sqlite3_file *)(sf + 1);
	memset(sf->real, 0, (size_t)real_vfs->szOsFile);
	rc = real_vfs->xOpen(real_vfs, name, sf->real, flags, out);
	f->pMethods = sf->real->pMethods ? &shim_io : NULL;
	return rc;
}

/* Makes the shim the default VFS (once per process). */
static void shim_install(void)
{
	if (real_vfs)
		return;
	real_vfs = sqlite3_vfs_find(NULL);
	ck_assert_ptr_nonnull(real_vfs);
	shim_vfs = *real_vfs;
	shim_vfs.zName = "apollo-faults";
	shim_vfs.szOsFile = (int)sizeof(shim_file) + real_vfs->szOsFile;
	shim_vfs.xOpen = shim_open;
	ck_assert_int_eq(sqlite3_vfs_register(&shim_vfs, 1), SQLITE_OK);
}

static void io_arm(long target)
{
	atomic_store(&io_count, 0);
	atomic_store(&io_target, target);
	atomic_store(&io_hit, false);
	atomic_store(&io_armed, true);
}

static long io_disarm(void)
{
	atomic_store(&io_armed, false);
	return atomic_load(&io_count);
}

static void key_of(int i, uint8_t key[32])
{
	char s[32];

	snprintf(s, sizeof(s), "key %d", i);
	ap_sha256(s, strlen(s), key);
}

static void value_of(int i, uint8_t *v, size_t n)
{
	for (size_t k = 0; k < n; k++)
		v[k] = (uint8_t)(i * 31 + k);
}

/* PRAGMA integrity_check on `path`, without faults: "ok" or what is wrong. */
static void integrity_ok(const char *path, long n)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;

	ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
	ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
	ck_assert_msg(!strcmp((const char *)sqlite3_column_text(st, 0), "ok"),
		      "I/O fault %ld: integrity_check: %s", n, sqlite3_column_text(st, 0));
	sqlite3_finalize(st);
	sqlite3_close(db);
}

enum { KEPT = 6, ADDED = 6, VAL = 3000 };

/* Opens the cache at `path`, reads the KEPT entries, writes ADDED more,
 * reads them back; with faults armed any of it may fail, never crash.
 * *stored[i] says whether writing entry KEPT+i reported success. */
static void cache_workload(const char *path, bool stored[ADDED])
{
	uint8_t key[32], v[VAL], *val;
	size_t len;
	ap_cache *c = NULL;
	ap_error err;

	if (ap_cache_open(path, &c, &err) == AP_ENOMEM)
		return;
	for (int i = 0; i < KEPT; i++) {
		key_of(i, key);
		value_of(i, v, VAL);
		if (ap_cache_get(c, key, &val, &len) == 1) {   /* verified: must be right */
			ck_assert_uint_eq(len, VAL);
			ck_assert(!memcmp(val, v, VAL));
			free(val);
		}
	}
	for (int i = 0; i < ADDED; i++) {
		key_of(KEPT + i, key);
		value_of(KEPT + i, v, VAL);
		stored[i] = ap_cache_put(c, key, v, VAL) == 0;
	}
	ap_cache_free(c);
}

START_TEST(cache_io_failures)
{
	char path[128], ref[128], cmd[512];
	uint8_t key[32], v[VAL], *val;
	size_t len;
	ap_cache *c = NULL;
	ap_error err;
	bool stored[ADDED];
	long total, tried = 0;

	make_tmpdir();
	shim_install();
	snprintf(ref, sizeof(ref), "%s/ref.db", tmpdir);
	snprintf(path, sizeof(path), "%s/cache.db", tmpdir);
	ck_assert_int_eq(ap_cache_open(ref, &c, &err), 0);
	for (int i = 0; i < KEPT; i++) {
		key_of(i, key);
		value_of(i, v, VAL);
		ck_assert_int_eq(ap_cache_put(c, key, v, VAL), 0);
	}
	ap_cache_free(c);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", ref, path);
	ck_assert_int_eq(system(cmd), 0);
	io_arm(0);
	cache_workload(path, stored);
	total = io_disarm();
	for (long n = 1; n <= total; n++) {
		snprintf(cmd, sizeof(cmd), "rm -f '%s'*; cp '%s' '%s'", path, ref, path);
		ck_assert_int_eq(system(cmd), 0);
		memset(stored, 0, sizeof(stored));
		io_arm(n);
		cache_workload(path, stored);
		io_disarm();
		tried++;
		/* intact: consistent, not moved aside, every entry committed
		 * before and every store that said so is there */
		integrity_ok(path, n);
		ck_assert_msg(access(path, F_OK) == 0, "I/O fault %ld: the cache was moved aside", n);
		ck_assert_int_eq(ap_cache_open(path, &c, &err), 0);
		for (int i = 0; i < KEPT + ADDED; i++) {
			if (i >= KEPT && !stored[i - KEPT])
				continue;
			key_of(i, key);
			value_of(i, v, VAL);
			ck_assert_msg(ap_cache_get(c, key, &val, &len) == 1,
				      "I/O fault %ld: entry %d lost", n, i);
			ck_assert(len == VAL && !memcmp(val, v, VAL));
			free(val);
		}
		ap_cache_free(c);
	}
	printf("cache_io_failures: %ld I/O operations, %ld tried\n", total, tried);
	remove_tmpdir();
}
END_TEST

/* A request whose cache fails at any I/O operation is still answered, with
 * the same bundle. */
START_TEST(compile_with_failing_cache)
{
	ap_graph *gr = model_graph("models/bert_like_2l");
	Apollo__Graph *g = ap_graph_to_pb(gr);
	char path[128], ns[32], msg[512], *ref = NULL, *t;
	ap_compiler_options co = { .threads = 1 };
	ap_compiler *c;
	ap_cache *cache = NULL;
	ap_error err;
	long total = 0, tried = 0;
	int code;

	make_tmpdir();
	shim_install();
	snprintf(path, sizeof(path), "%s/cache.db", tmpdir);
	for (long n = 0;; n++) {
		ck_assert_int_eq(ap_cache_open(path, &cache, &err), 0);
		c = ap_compiler_new(cache, &co);
		ck_assert_ptr_nonnull(c);
		if (n == 0) {   /* fill the kernel cache; count one request's I/O */
			ref = compile_text(c, g, "ref", &code, msg, sizeof(msg));
			ck_assert_msg(code == 0, "%s", msg);
			io_arm(0);
			free(compile_text(c, g, "count", &code, msg, sizeof(msg)));
			total = io_disarm();
		} else {
			snprintf(ns, sizeof(ns), "n%ld", n);
			io_arm(n);
			t = compile_text(c, g, ns, &code, msg, sizeof(msg));
			io_disarm();
			tried++;
			ck_assert_msg(code == 0, "I/O fault %ld failed the request: %s", n, msg);
			ck_assert_msg(!strcmp(t, ref), "I/O fault %ld changed the bundle", n);
			free(t);
		}
		ap_compiler_free(c);
		ap_cache_free(cache);
		integrity_ok(path, n);
		if (n >= total)
			break;
	}
	printf("compile_with_failing_cache: %ld I/O operations, %ld tried\n", total, tried);
	free(ref);
	ap_graph_pb_free(g);
	ap_graph_free(gr);
	remove_tmpdir();
}
END_TEST


/* bert_like_2l with every initializer's raw_data over 1 KiB moved into
 * dir/w.bin (ONNX external data): the serialized model, malloc'd. */
static uint8_t *externalised_model(const char *dir, size_t *len)
{
	size_t n = 0;
	uint8_t *buf = model_bytes("models/bert_like_2l", &n), *out;
	Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, n, buf);
	static Onnx__StringStringEntryProto ents[256][3];
	static Onnx__StringStringEntryProto *ptrs[256][3];
	static char vals[256][2][32];
	ProtobufCBinaryData saved[256];
	char path[600];
	FILE *f;
	long off = 0;
	int k = 0;

	ck_assert_ptr_nonnull(m);
	snprintf(path, sizeof(path), "%s/w.bin", dir);
	f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	for (size_t i = 0; i < m->graph->n_initializer && k < 256; i++) {
		Onnx__TensorProto *t = m->graph->initializer[i];
		const char *keys[3] = { "location", "offset", "length" };

		if (!t->has_raw_data || t->raw_data.len <= 1024)
			continue;
		ck_assert_uint_eq(fwrite(t->raw_data.data, 1, t->raw_data.len, f), t->raw_data.len);
		snprintf(vals[k][0], 32, "%ld", off);
		snprintf(vals[k][1], 32, "%zu", t->raw_data.len);
		off += (long)t->raw_data.len;
		for (int e = 0; e < 3; e++) {
			onnx__string_string_entry_proto__init(&ents[k][e]);
			ents[k][e].key = (char *)keys[e];
			ents[k][e].value = e == 0 ? "w.bin" : vals[k][e - 1];
			ptrs[k][e] = &ents[k][e];
		}
		saved[k] = t->raw_data;
		t->has_raw_data = 0;
		t->raw_data.len = 0;
		t->n_external_data = 3;
		t->external_data = ptrs[k];
		t->has_data_location = 1;
		t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
		k++;
	}
	fclose(f);
	ck_assert_int_gt(k, 0);
	*len = onnx__model_proto__get_packed_size(m);
	out = malloc(*len);
	ck_assert_ptr_nonnull(out);
	onnx__model_proto__pack(m, out);
	/* give the decoder back what it owns before freeing */
	for (size_t i = 0, j = 0; i < m->graph->n_initializer && j < (size_t)k; i++) {
		Onnx__TensorProto *t = m->graph->initializer[i];

		if (t->n_external_data != 3 || t->external_data != ptrs[j])
			continue;
		t->raw_data = saved[j++];
		t->has_raw_data = 1;
		t->n_external_data = 0;
		t->external_data = NULL;
	}
	onnx__model_proto__free_unpacked(m, NULL);
	free(buf);
	return out;
}

/* The importer reading external data (ap_onnx_import_dir) with each
 * allocation failing in turn: a clean error or the same graph and
 * weights, never a crash or a leak. */
START_TEST(external_data_allocation_failures)
{
	char dir[] = "/tmp/apollo-faults.XXXXXX", cmd[100];
	size_t len = 0, ilen = 0;
	uint8_t *buf, *inl = model_bytes("models/bert_like_2l", &ilen), ref[32], h[32];
	ap_params *params = NULL, *iparams = NULL;
	ap_error err;
	ap_graph *g;
	long total, tried = 0;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	buf = externalised_model(dir, &len);
	/* the same graph and weights as the model with its data inside */
	g = ap_onnx_import(inl, ilen, NULL, 0, &iparams, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_graph_hash_named(g, ref), 0);
	ap_graph_free(g);
	fa_arm(0);
	g = ap_onnx_import_dir(buf, len, dir, NULL, 0, &params, &err);
	total = fa_disarm();
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_graph_hash_named(g, h), 0);
	ck_assert_int_eq(memcmp(h, ref, 32), 0);
	ck_assert_int_eq(params->n, iparams->n);
	for (int i = 0; i < params->n; i++) {
		const ap_host_tensor *a = params->items[i], *b = ap_params_find(iparams, a->name);

		ck_assert_ptr_nonnull(b);
		ck_assert_uint_eq(a->nbytes, b->nbytes);
		ck_assert_int_eq(memcmp(a->data, b->data, a->nbytes), 0);
	}
	ap_graph_free(g);
	ap_params_free(params);
	ap_params_free(iparams);
	for (long n = 1;; n = fa_next(n, total)) {
		params = NULL;
		fa_arm(n);
		g = ap_onnx_import_dir(buf, len, dir, NULL, 0, &params, &err);
		fa_disarm();
		tried++;
		if (g) {
			ck_assert_int_eq(ap_graph_hash_named(g, h), 0);
			ck_assert_msg(!memcmp(h, ref, 32), "allocation %ld failed and the graph changed",
				      n);
			ap_graph_free(g);
			ap_params_free(params);
			if (!atomic_load(&fa_hit))
				break;
			continue;
		}
		ck_assert_msg(atomic_load(&fa_hit), "import failed without a fault: %s", err.msg);
		ck_assert_ptr_null(params);
		check_error("external data", n, err.code, &err);
	}
	printf("external_data_allocation_failures: %ld allocations, %ld tried\n", total, tried);
	free(buf);
	free(inl);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *faults_suite(void)
{
	Suite *s = suite_create("faults");
	TCase *tc = tcase_create("allocation");
	TCase *io = tcase_create("io");

	tcase_set_timeout(tc, 1200);
	tcase_add_test(tc, decoder_allocation_failures);
	tcase_add_test(tc, importer_allocation_failures);
	tcase_add_test(tc, external_data_allocation_failures);
	tcase_add_test(tc, program_allocation_failures);
	tcase_add_test(tc, compile_allocation_failures);
	suite_add_tcase(s, tc);
	tcase_set_timeout(io, 1200);
	tcase_add_test(io, cache_io_failures);
	tcase_add_test(io, compile_with_failing_cache);
	suite_add_tcase(s, io);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(faults_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
