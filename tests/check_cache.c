/* check_cache.c -- the SQLite cache (server/cache/cache.c): action cache,
 * content-addressed blobs verified on read, the kernel cache, concurrent
 * writers, persistence, a cache that cannot work turning itself off, and a
 * file that is not a database (garbage, truncated, broken at run time)
 * replaced by a fresh one at the next open; the size limit with least
 * recently used eviction, the schema 1 upgrade and the memory tier (its
 * blobs lent by reference, evicted safely while held); no
 * room for a write -- a real file-size limit (EFBIG) and a real full file
 * system (ENOSPC, a small tmpfs) -- degrading the cache instead of turning
 * it off, with retries on a back-off and recovery once there is room; the
 * tiers (server/cache/tiers.c) over L1 alone (with Redis: check_redis). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/graph.h"
#include "server/cache/cache.h"
#include "server/cache/tiers.h"
#include "server/config.h"

static char dir[64];
static char db[128];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/apollo-cache-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	/* A directory that does not exist yet: open creates it. */
	snprintf(db, sizeof(db), "%s/sub/dir/cache.db", dir);
	ap_log_set_level(AP_LOG_ERROR);
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
}

static void key_of(const char *s, uint8_t key[32])
{
	ap_sha256(s, strlen(s), key);
}

static ap_cache *open_ok(void)
{
	ap_cache *c = NULL;
	ap_error err;

	ck_assert_int_eq(ap_cache_open(db, &c, &err), 0);
	ck_assert_ptr_nonnull(c);
	ck_assert(ap_cache_enabled(c));
	ck_assert_str_eq(ap_cache_path(c), db);
	return c;
}

/* Issue 29, item 1: a database in a directory others can write, or a
 * -wal file others can write, is refused (ap_cache_check_path) and never
 * opened (ap_cache_open leaves the cache off). */
START_TEST(untrusted_database_refused)
{
	char open_dir[128], path[192], wal[200];
	ap_cache *c = NULL;
	ap_error err;
	FILE *f;

	snprintf(open_dir, sizeof(open_dir), "%s/open", dir);
	ck_assert_int_eq(mkdir(open_dir, 0700), 0);
	snprintf(path, sizeof(path), "%s/cache.db", open_dir);
	ck_assert_int_eq(ap_cache_check_path(path, &err), 0);
	ck_assert_int_eq(chmod(open_dir, 01777), 0);   /* sticky is not enough */
	ck_assert_int_eq(ap_cache_check_path(path, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, open_dir));
	ck_assert_int_eq(ap_cache_open(path, &c, &err), AP_EIO);
	ck_assert(!ap_cache_enabled(c));
	ap_cache_free(c);
	ck_assert_int_ne(access(path, F_OK), 0);       /* nothing was created */
	ck_assert_int_eq(chmod(open_dir, 0700), 0);
	/* a -wal planted beside the database, writable by others */
	snprintf(wal, sizeof(wal), "%s-wal", path);
	f = fopen(wal, "w");
	ck_assert_ptr_nonnull(f);
	fclose(f);
	ck_assert_int_eq(chmod(wal, 0666), 0);
	ck_assert_int_eq(ap_cache_check_path(path, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "-wal"));
	ck_assert_int_eq(unlink(wal), 0);
	ck_assert_int_eq(ap_cache_check_path("off", &err), 0);
}
END_TEST

START_TEST(put_get)
{
	ap_cache *c = open_ok();
	uint8_t k1[32], k2[32], *val = NULL;
	size_t len = 0;
	ap_cache_counts n;

	key_of("graph one", k1);
	key_of("graph two", k2);
	ck_assert_int_eq(ap_cache_get(c, k1, &val, &len), 0);
	ck_assert_int_eq(ap_cache_put(c, k1, (const uint8_t *)"bundle-1", 8), 0);
	ck_assert_int_eq(ap_cache_get(c, k1, &val, &len), 1);
	ck_assert_uint_eq(len, 8);
	ck_assert_int_eq(memcmp(val, "bundle-1", 8), 0);
	free(val);
	ck_assert_int_eq(ap_cache_get(c, k2, &val, &len), 0);

	/* Replacing a key's value: the newest wins, still one entry. */
	ck_assert_int_eq(ap_cache_put(c, k1, (const uint8_t *)"bundle-1b", 9), 0);
	ck_assert_int_eq(ap_cache_get(c, k1, &val, &len), 1);
	ck_assert_uint_eq(len, 9);
	ck_assert_int_eq(memcmp(val, "bundle-1b", 9), 0);
	free(val);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.actions, 1);
	ck_assert_uint_eq(n.blobs, 2);
	ck_assert_uint_eq(n.blob_bytes, 17);

	/* An empty value is a value. */
	ck_assert_int_eq(ap_cache_put(c, k2, (const uint8_t *)"", 0), 0);
	ck_assert_int_eq(ap_cache_get(c, k2, &val, &len), 1);
	ck_assert_uint_eq(len, 0);
	free(val);
	ap_cache_free(c);
}
END_TEST

START_TEST(persists_across_open)
{
	ap_cache *c = open_ok();
	uint8_t k[32], *val = NULL;
	size_t len = 0;
	ap_cache_counts n;

	key_of("persist", k);
	ck_assert_int_eq(ap_cache_put(c, k, (const uint8_t *)"abc", 3), 0);
	ap_cache_free(c);
	c = open_ok();
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 1);
	ck_assert_int_eq(memcmp(val, "abc", 3), 0);
	free(val);
	ap_cache_get_counts(c, &n);   /* counted again at open */
	ck_assert_uint_eq(n.actions, 1);
	ck_assert_uint_eq(n.blobs, 1);
	ck_assert_uint_eq(n.blob_bytes, 3);
	ap_cache_free(c);
}
END_TEST

/* A blob whose bytes no longer match its digest is a miss, and its row is
 * deleted; storing the bytes again repairs it. */
START_TEST(digest_mismatch_is_a_miss)
{
	ap_cache *c = open_ok();
	const uint8_t good[] = "the compiled kernel";
	uint8_t digest[32], want[32], k[32], *val = NULL;
	size_t len = 0;
	ap_cache_counts n;

	ck_assert_int_eq(ap_cache_blob_put(c, good, sizeof(good), digest), 0);
	ap_sha256(good, sizeof(good), want);
	ck_assert_int_eq(memcmp(digest, want, 32), 0);
	ck_assert_int_eq(ap_cache_blob_get(c, digest, &val, &len), 1);
	free(val);

	ck_assert_int_eq(ap__cache_blob_overwrite(c, digest, (const uint8_t *)"tampered", 8), 0);
	val = NULL;
	ck_assert_int_eq(ap_cache_blob_get(c, digest, &val, &len), 0);
	ck_assert_ptr_null(val);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.blobs, 0);
	/* The row is gone, not only skipped: overwriting finds nothing now,
	 * and a later store puts the right bytes back. */
	ck_assert_int_eq(ap_cache_blob_get(c, digest, &val, &len), 0);
	ck_assert_int_eq(ap_cache_blob_put(c, good, sizeof(good), NULL), 0);
	ck_assert_int_eq(ap_cache_blob_get(c, digest, &val, &len), 1);
	ck_assert_int_eq(memcmp(val, good, sizeof(good)), 0);
	free(val);

	/* Through the action cache too. */
	key_of("action", k);
	ck_assert_int_eq(ap_cache_put(c, k, (const uint8_t *)"bundle bytes", 12), 0);
	ap_sha256("bundle bytes", 12, digest);
	ck_assert_int_eq(ap__cache_blob_overwrite(c, digest, (const uint8_t *)"bundle bytez", 12), 0);
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 0);
	ap_cache_free(c);
}
END_TEST

/* A check of ap_tiers_action_get taking every bundle it is shown. */
static bool take_any(void *user, int tier, const ap_tier_action *a)
{
	*(int *)user = tier;
	return a->len > 0;
}

/* The tiers over L1 alone (no Redis; cache/tiers.h): the policy table, a
 * kernel written through and read back from L1 (counted), misses counted,
 * a blob put that writes no L1 row (the kernel's carries it), a bundle
 * taken by its check, and nothing written to L1 by an L2-only put. */
START_TEST(tiers_without_redis)
{
	ap_cache *c = open_ok();
	ap_tiers *t = ap_tiers_new(c, NULL);
	const uint8_t blob[] = "compiled kernel bytes";
	uint8_t k[32], k2[32], d[32], dg[32], *val = NULL;
	size_t len = 0;
	int seen = 0;
	ap_tiers_counts n;
	ap_cache_counts cc;

	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_eq(ap_tiers_cache(t), c);
	ck_assert_ptr_null(ap_tiers_redis(t));
	ck_assert_ptr_null(ap_tiers_policy(AP_TIER_KINDS));
	for (int kind = 0; kind < AP_TIER_KINDS; kind++) {
		ck_assert(ap_tiers_policy(kind)->get_l1);
		ck_assert(ap_tiers_policy(kind)->copy_l2_hit == (kind != AP_TIER_BLOB));
	}
	key_of("tiers kernel", k);
	key_of("tiers kernel two", k2);
	ap_sha256(blob, sizeof(blob), d);
	ck_assert_int_eq(ap_tiers_kernel_get(t, k, 0, &val, &len, dg), AP_TIER_MISS);
	ck_assert_int_eq(ap_tiers_blob_put(t, blob, sizeof(blob), d), 0);
	ap_cache_get_counts(c, &cc);
	ck_assert_uint_eq(cc.blobs, 0);
	ck_assert_int_eq(ap_tiers_kernel_put(t, k, AP_TIERS_L2_ONLY, blob, sizeof(blob), d), 0);
	ck_assert_int_eq(ap_tiers_kernel_get(t, k, 0, &val, &len, dg), AP_TIER_MISS);
	ck_assert_int_eq(ap_tiers_kernel_put(t, k, 0, blob, sizeof(blob), d), 0);
	ck_assert_int_eq(ap_tiers_kernel_get(t, k, 0, &val, &len, dg), AP_TIER_L1);
	ck_assert_uint_eq(len, sizeof(blob));
	ck_assert_mem_eq(val, blob, len);
	ck_assert_mem_eq(dg, d, 32);
	free(val);
	val = NULL;
	ck_assert_int_eq(ap_tiers_blob_get(t, d, 0, &val, &len), AP_TIER_L1);
	free(val);
	val = NULL;
	ap_tiers_get_counts(t, AP_TIER_KERNEL, &n);
	ck_assert_uint_eq(n.l1_hits, 1);
	ck_assert_uint_eq(n.misses, 2);
	ck_assert_uint_eq(n.l2_hits, 0);
	ck_assert_uint_eq(n.puts, 2);
	ck_assert_int_eq(ap_tiers_action_get(t, k2, 0, take_any, &seen, NULL), AP_TIER_MISS);
	ck_assert_int_eq(ap_tiers_action_put(t, k2, 0, (const uint8_t *)"bundle", 6, 0, NULL, NULL),
			 0);
	ck_assert_int_eq(ap_tiers_action_get(t, k2, 0, take_any, &seen, NULL), AP_TIER_L1);
	ck_assert_int_eq(seen, AP_TIER_L1);
	ck_assert_int_eq(ap_cache_get(c, k2, &val, &len), 1);
	ck_assert_mem_eq(val, "bundle", 6);
	free(val);
	{
		ap_blob *b = NULL;

		ck_assert_int_eq(ap_tiers_action_ref(t, k, &b), AP_TIER_MISS);
		ck_assert_int_eq(ap_tiers_action_ref(t, k2, &b), AP_TIER_L1);
		ck_assert_uint_eq(ap_blob_len(b), 6);
		ck_assert_mem_eq(ap_blob_data(b), "bundle", 6);
		ap_blob_release(b);
		ap_tiers_get_counts(t, AP_TIER_ACTION, &n);
		ck_assert_uint_eq(n.l1_hits, 2);
		ck_assert_uint_eq(n.misses, 1);
	}
	ap_tiers_free(t);
	ap_cache_free(c);
}
END_TEST

/* Two kernel keys naming the same bytes store them once. */
START_TEST(kernel_shared_by_two_keys)
{
	ap_cache *c = open_ok();
	const uint8_t ptx[] = ".version 8.0\n.target sm_80\n";
	uint8_t k1[32], k2[32], d1[32], d2[32], dg[32], *val = NULL;
	size_t len = 0;
	ap_cache_counts n;

	key_of("kernel of graph A", k1);
	key_of("kernel of graph B", k2);
	ck_assert_int_eq(ap_cache_kernel_get(c, k1, &val, &len, dg), 0);
	ck_assert_int_eq(ap_cache_kernel_put(c, k1, ptx, sizeof(ptx), d1), 0);
	ck_assert_int_eq(ap_cache_kernel_put(c, k2, ptx, sizeof(ptx), d2), 0);
	ck_assert_int_eq(memcmp(d1, d2, 32), 0);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.kernels, 2);
	ck_assert_uint_eq(n.blobs, 1);
	ck_assert_uint_eq(n.blob_bytes, sizeof(ptx));
	ck_assert_int_eq(ap_cache_kernel_get(c, k2, &val, &len, dg), 1);
	ck_assert_uint_eq(len, sizeof(ptx));
	ck_assert_int_eq(memcmp(val, ptx, len), 0);
	ck_assert_int_eq(memcmp(dg, d1, 32), 0);
	free(val);
	ap_cache_free(c);
}
END_TEST

struct writer {
	ap_cache *c;
	int id, failures;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;

	for (int i = 0; i < 150; i++) {
		char name[64], value[64];
		uint8_t k[32];

		snprintf(name, sizeof(name), "writer %d key %d", w->id, i);
		snprintf(value, sizeof(value), "value %d/%d", w->id, i);
		key_of(name, k);
		if (ap_cache_put(w->c, k, (const uint8_t *)value, strlen(value)))
			w->failures++;
		/* Both writers also store one shared kernel. */
		key_of(name, k);
		k[0] ^= 0xff;
		if (ap_cache_kernel_put(w->c, k, (const uint8_t *)"shared", 6, NULL))
			w->failures++;
	}
	return NULL;
}

/* Two threads on one cache and two threads on a second cache object for the
 * same file (two daemons sharing it): every write lands. */
START_TEST(concurrent_writers)
{
	ap_cache *c1 = open_ok(), *c2 = open_ok();
	struct writer w[4] = { { c1, 0, 0 }, { c1, 1, 0 }, { c2, 2, 0 }, { c2, 3, 0 } };
	pthread_t t[4];
	ap_cache_counts n;

	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, writer_main, &w[i]), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(w[i].failures, 0);
	ck_assert(ap_cache_enabled(c1));
	ck_assert(ap_cache_enabled(c2));
	for (int id = 0; id < 4; id++) {
		for (int i = 0; i < 150; i += 7) {
			char name[64], value[64];
			uint8_t k[32], *val = NULL;
			size_t len = 0;

			snprintf(name, sizeof(name), "writer %d key %d", id, i);
			snprintf(value, sizeof(value), "value %d/%d", id, i);
			key_of(name, k);
			ck_assert_int_eq(ap_cache_get(c1, k, &val, &len), 1);
			ck_assert_uint_eq(len, strlen(value));
			ck_assert_int_eq(memcmp(val, value, len), 0);
			free(val);
		}
	}
	ap_cache_free(c1);
	ap_cache_free(c2);
	c1 = open_ok();
	ap_cache_get_counts(c1, &n);
	ck_assert_uint_eq(n.actions, 600);
	ck_assert_uint_eq(n.kernels, 600);
	ck_assert_uint_eq(n.blobs, 601);
	ap_cache_free(c1);
}
END_TEST

/* A path that cannot hold a database: the cache is off, lookups miss,
 * stores fail softly, nothing crashes. */
START_TEST(unopenable_path_degrades)
{
	char file[128], path[160];
	ap_cache *c = NULL;
	ap_error err;
	uint8_t k[32], *val = NULL;
	size_t len = 0;
	FILE *f;

	snprintf(file, sizeof(file), "%s/plainfile", dir);
	f = fopen(file, "w");
	ck_assert_ptr_nonnull(f);
	fclose(f);
	snprintf(path, sizeof(path), "%s/cache.db", file);   /* under a regular file */
	ck_assert_int_eq(ap_cache_open(path, &c, &err), AP_EIO);
	ck_assert_ptr_nonnull(c);
	ck_assert(!ap_cache_enabled(c));
	ck_assert_ptr_nonnull(strstr(err.msg, "plainfile"));
	key_of("k", k);
	ck_assert_int_lt(ap_cache_put(c, k, (const uint8_t *)"v", 1), 0);
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 0);
	ck_assert_int_lt(ap_cache_kernel_put(c, k, (const uint8_t *)"v", 1, NULL), 0);
	ck_assert_int_eq(ap_cache_kernel_get(c, k, &val, &len, NULL), 0);
	ap_cache_free(c);
}
END_TEST

/* Issue 11, item 9: a file that is not an SQLite database (garbage,
 * truncated) used to leave the daemon without a cache on every restart
 * until someone removed it.  It is moved aside (cache.db.corrupt-TIME)
 * and a fresh cache is created. */
START_TEST(garbage_file_is_replaced)
{
	char path[160], cmd[400];
	ap_cache *c = NULL;
	ap_error err;
	uint8_t k[32], *val = NULL;
	size_t len = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/garbage.db", dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	for (int i = 0; i < 8192; i++)
		fputc("not a database "[i % 15], f);
	fclose(f);
	ck_assert_int_eq(ap_cache_open(path, &c, &err), 0);
	ck_assert(ap_cache_enabled(c));
	key_of("k", k);
	ck_assert_int_eq(ap_cache_put(c, k, (const uint8_t *)"v", 1), 0);
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 1);
	free(val);
	ap_cache_free(c);
	/* the old bytes are kept beside it, for a post-mortem */
	snprintf(cmd, sizeof(cmd), "grep -qs 'not a database' %s.corrupt-*", path);
	ck_assert_int_eq(system(cmd), 0);
	/* and the new file is a cache from now on */
	ck_assert_int_eq(ap_cache_open(path, &c, &err), 0);
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 1);
	free(val);
	ap_cache_free(c);
}
END_TEST

/* A database cut short (a crash of the disk, a full file system, cp
 * interrupted): replaced as well, whatever part is missing. */
START_TEST(truncated_file_is_replaced)
{
	uint8_t k[32], *val = NULL, big[20000];
	size_t len = 0;
	ap_cache *c = open_ok();
	struct stat st;

	memset(big, 7, sizeof(big));
	for (int i = 0; i < 64; i++) {
		char name[16];
		snprintf(name, sizeof(name), "k%d", i);
		key_of(name, k);
		big[0] = (uint8_t)i;
		ck_assert_int_eq(ap_cache_put(c, k, big, sizeof(big)), 0);
	}
	ap_cache_free(c);
	ck_assert_int_eq(stat(db, &st), 0);
	for (off_t cut = 4096; cut < st.st_size; cut *= 4) {
		ap_error err;

		ck_assert_int_eq(truncate(db, cut), 0);
		c = NULL;
		ck_assert_int_eq(ap_cache_open(db, &c, &err), 0);
		/* a lookup either misses or finds a verified value; a store works */
		for (int i = 0; i < 64 && ap_cache_enabled(c); i++) {
			char name[16];
			snprintf(name, sizeof(name), "k%d", i);
			key_of(name, k);
			if (ap_cache_get(c, k, &val, &len) == 1) {
				ck_assert_uint_eq(len, sizeof(big));
				free(val);
			}
		}
		ap_cache_free(c);
		c = open_ok();
		key_of("after", k);
		ck_assert_int_eq(ap_cache_put(c, k, (const uint8_t *)"v", 1), 0);
		ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 1);
		free(val);
		ap_cache_free(c);
		ck_assert_int_eq(stat(db, &st), 0);
	}
}
END_TEST

/* The file is destroyed while the cache is open: the next operation turns
 * the cache off instead of failing the caller. */
START_TEST(io_error_at_run_time_degrades)
{
	ap_cache *c = open_ok();
	uint8_t k[32], *val = NULL;
	size_t len = 0;
	char junk[4096];
	int fd;

	key_of("before", k);
	ck_assert_int_eq(ap_cache_put(c, k, (const uint8_t *)"v", 1), 0);
	memset(junk, 'J', sizeof(junk));
	/* The database, its write-ahead log and its shared-memory index. */
	for (int f = 0; f < 3; f++) {
		char path[200];
		snprintf(path, sizeof(path), "%s%s", db, f == 0 ? "" : f == 1 ? "-wal" : "-shm");
		fd = open(path, O_WRONLY);
		ck_assert_int_ge(fd, 0);
		for (int i = 0; i < 8; i++)
			ck_assert_int_eq(write(fd, junk, sizeof(junk)), (int)sizeof(junk));
		close(fd);
	}
	/* WAL frames may still answer this read... */
	(void)ap_cache_get(c, k, &val, &len);
	free(val);
	val = NULL;
	/* ...but writes and fresh reads reach the broken file. */
	for (int i = 0; i < 4 && ap_cache_enabled(c); i++) {
		char name[32];
		snprintf(name, sizeof(name), "after %d", i);
		key_of(name, k);
		(void)ap_cache_put(c, k, (const uint8_t *)"w", 1);
		(void)ap_cache_get(c, k, &val, &len);
		free(val);
		val = NULL;
	}
	ck_assert(!ap_cache_enabled(c));
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 0);
	ck_assert_int_lt(ap_cache_put(c, k, (const uint8_t *)"w", 1), 0);
	ap_cache_free(c);
	/* the next start (a new open) replaces the broken file */
	c = open_ok();
	ck_assert_int_eq(ap_cache_put(c, k, (const uint8_t *)"w", 1), 0);
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 1);
	free(val);
	ap_cache_free(c);
}
END_TEST

/* A value of `n` bytes, all `fill`. */
static void put_sized(ap_cache *c, const char *key, int fill, size_t n)
{
	uint8_t k[32], *v = malloc(n);

	ck_assert_ptr_nonnull(v);
	memset(v, fill, n);
	key_of(key, k);
	ck_assert_int_eq(ap_cache_put(c, k, v, n), 0);
	free(v);
}

static int has(ap_cache *c, const char *key)
{
	uint8_t k[32], *v = NULL;
	size_t len = 0;
	int found;

	key_of(key, k);
	found = ap_cache_get(c, k, &v, &len);
	free(v);
	return found;
}

/* Past max_bytes the least recently used blobs go, with the keys naming
 * them; a read makes a blob recent again (at most once a minute). */
START_TEST(lru_eviction)
{
	ap_cache *c = open_ok();
	ap_cache_counts n;

	ap_cache_set_limits(c, 1000, 0);
	ap__cache_set_time(c, 1000);
	put_sized(c, "a", 'a', 400);
	ap__cache_set_time(c, 1001);
	put_sized(c, "b", 'b', 400);
	ap__cache_set_time(c, 1030);
	ck_assert_int_eq(has(c, "a"), 1);          /* 29 s later: not marked again */
	ap__cache_set_time(c, 1100);
	ck_assert_int_eq(has(c, "a"), 1);          /* marked used at 1100 */
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.blob_bytes, 800);
	ck_assert_uint_eq(n.evicted_blobs, 0);

	ap__cache_set_time(c, 1101);
	put_sized(c, "c", 'c', 400);               /* 1200 > 1000: b is the oldest */
	ck_assert_int_eq(has(c, "b"), 0);
	ck_assert_int_eq(has(c, "a"), 1);
	ck_assert_int_eq(has(c, "c"), 1);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.blob_bytes, 800);
	ck_assert_uint_eq(n.blobs, 2);
	ck_assert_uint_eq(n.actions, 2);
	ck_assert_uint_eq(n.evicted_blobs, 1);
	ck_assert_uint_eq(n.evicted_bytes, 400);
	ck_assert_uint_eq(n.max_bytes, 1000);

	/* Lowering the limit evicts at once, down to 90% of it. */
	ap_cache_set_limits(c, 500, 0);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.blob_bytes, 400);
	ck_assert_int_eq(has(c, "a"), 0);          /* a: used at 1100, c at 1101 */
	ck_assert_int_eq(has(c, "c"), 1);
	ap_cache_free(c);

	/* The order is in the file: another process sees it. */
	c = open_ok();
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.blobs, 1);
	ck_assert_uint_eq(n.actions, 1);
	ap_cache_free(c);
}
END_TEST

/* A schema 1 file (before the size limit) is upgraded in place. */
START_TEST(schema_1_upgraded)
{
	sqlite3 *db1;
	ap_cache *c;
	uint8_t k[32], d[32], *val = NULL;
	size_t len = 0;
	char sql[1024], kh[65], dh[65];

	c = open_ok();   /* creates the directories */
	ap_cache_free(c);
	unlink(db);
	key_of("old key", k);
	ap_sha256("old value", 9, d);
	ap_hex(k, 32, kh);
	ap_hex(d, 32, dh);
	snprintf(sql, sizeof(sql),
		 "CREATE TABLE meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);"
		 "CREATE TABLE blobs(digest BLOB PRIMARY KEY, size INTEGER NOT NULL, data BLOB NOT NULL);"
		 "CREATE TABLE actions(key BLOB PRIMARY KEY, digest BLOB NOT NULL, created INTEGER NOT NULL);"
		 "CREATE TABLE kernels(key BLOB PRIMARY KEY, digest BLOB NOT NULL, created INTEGER NOT NULL);"
		 "INSERT INTO meta VALUES ('schema', '1');"
		 "INSERT INTO blobs VALUES (x'%s', 9, CAST('old value' AS BLOB));"
		 "INSERT INTO actions VALUES (x'%s', x'%s', 1);", dh, kh, dh);
	ck_assert_int_eq(sqlite3_open(db, &db1), SQLITE_OK);
	ck_assert_int_eq(sqlite3_exec(db1, sql, NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db1);

	c = open_ok();
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 1);
	ck_assert_uint_eq(len, 9);
	ck_assert_int_eq(memcmp(val, "old value", 9), 0);
	free(val);
	ap_cache_set_limits(c, 1, 0);   /* the index and the column work */
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 0);
	ap_cache_free(c);
}
END_TEST

/* Blobs read (and verified) once are served from memory; a cache without
 * the memory tier reads and verifies the file every time. */
START_TEST(memory_tier)
{
	ap_cache *c = open_ok(), *plain = open_ok();
	uint8_t k[32], d[32], *val = NULL;
	size_t len = 0;
	ap_cache_counts n;

	ap_cache_set_limits(c, 0, 1 << 20);
	key_of("hot", k);
	ck_assert_int_eq(ap_cache_put(c, k, (const uint8_t *)"hot bundle", 10), 0);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.memory_blobs, 0);      /* stores do not fill it */
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 1);
	free(val);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.memory_blobs, 1);
	ck_assert_uint_eq(n.memory_bytes, 10);
	ck_assert_uint_eq(n.memory_hits, 0);

	ap_sha256("hot bundle", 10, d);
	ck_assert_int_eq(ap__cache_blob_overwrite(c, d, (const uint8_t *)"hot bundlX", 10), 0);
	ck_assert_int_eq(ap_cache_get(c, k, &val, &len), 1);
	ck_assert_int_eq(memcmp(val, "hot bundle", 10), 0);   /* the verified bytes */
	free(val);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.memory_hits, 1);
	ck_assert_int_eq(ap_cache_get(plain, k, &val, &len), 0);   /* the file is verified */
	ap_cache_free(plain);
	ap_cache_free(c);
}
END_TEST

/* Issue 26, item 2: the memory tier lends blobs by reference.  Two
 * readers of one digest get the same bytes (pointer identity), nothing is
 * copied for them, and a blob evicted from the tier while a reader holds
 * it stays whole until that reader gives it back (ASan checks the last). */
START_TEST(memory_tier_references)
{
	ap_cache *c = open_ok();
	uint8_t d[4][32], *bytes[4];
	ap_blob *a = NULL, *b = NULL, *x = NULL;
	ap_blob_counts before, after;
	ap_cache_counts n;
	const size_t len = 3000;

	ap_cache_set_limits(c, 0, 4000);   /* room for one blob of 3000 bytes */
	for (int i = 0; i < 4; i++) {
		bytes[i] = malloc(len);
		memset(bytes[i], 'a' + i, len);
		ck_assert_int_eq(ap_cache_blob_put(c, bytes[i], len, d[i]), 0);
	}
	ck_assert_int_eq(ap_cache_blob_ref(c, d[0], &a), 1);   /* read from the file */
	ap__blob_get_counts(&before);
	ck_assert_int_eq(ap_cache_blob_ref(c, d[0], &b), 1);   /* from the tier */
	ap__blob_get_counts(&after);
	ck_assert_ptr_eq(ap_blob_data(a), ap_blob_data(b));   /* one blob, two holders */
	ck_assert_uint_eq(after.made, before.made);
	ck_assert_uint_eq(after.bytes_copied, before.bytes_copied);
	ck_assert_int_eq(memcmp(ap_blob_digest(a), d[0], 32), 0);
	b = ap_blob_release(b);

	/* another blob takes the tier's room: d[0]'s entry goes, `a` stays */
	ck_assert_int_eq(ap_cache_blob_ref(c, d[1], &x), 1);
	ap_cache_get_counts(c, &n);
	ck_assert_uint_eq(n.memory_blobs, 1);
	ck_assert_uint_eq(n.memory_bytes, len);
	ck_assert_uint_eq(ap_blob_len(a), len);
	ck_assert_int_eq(memcmp(ap_blob_data(a), bytes[0], len), 0);
	/* d[0] again: read from the file into a new blob, evicting d[1]'s entry
	 * while `x` holds it */
	ck_assert_int_eq(ap_cache_blob_ref(c, d[0], &b), 1);
	ck_assert_ptr_ne(ap_blob_data(a), ap_blob_data(b));
	ck_assert_int_eq(memcmp(ap_blob_data(x), bytes[1], len), 0);
	a = ap_blob_release(a);
	b = ap_blob_release(b);
	x = ap_blob_release(x);
	/* the tier's own reference outlives the cache's readers; freeing the
	 * cache gives it back */
	ap__blob_get_counts(&before);
	ap_cache_free(c);
	ap__blob_get_counts(&after);
	ck_assert_uint_eq(after.alive + 1, before.alive);
	for (int i = 0; i < 4; i++)
		free(bytes[i]);
}
END_TEST

/* Readers on several threads take and give back references while the
 * tier, smaller than the blobs they read, evicts all the time: every read
 * sees its own digest's bytes (run under ASan and TSan by make
 * check-asan / check-tsan). */
struct ref_reader {
	pthread_t th;
	ap_cache *c;
	uint8_t (*d)[32];
	int n_blobs, seed;
	int bad;
};

static void *ref_reader_main(void *arg)
{
	struct ref_reader *r = arg;
	unsigned x = (unsigned)r->seed;

	for (int i = 0; i < 2000; i++) {
		ap_blob *b = NULL;
		uint8_t actual[32];
		int k;

		x = x * 1103515245u + 12345u;
		k = (int)((x >> 16) % (unsigned)r->n_blobs);
		if (ap_cache_blob_ref(r->c, r->d[k], &b) != 1) {
			r->bad++;
			continue;
		}
		sched_yield();   /* let another thread evict it meanwhile */
		ap_sha256(ap_blob_data(b), ap_blob_len(b), actual);
		r->bad += memcmp(actual, r->d[k], 32) != 0;
		ap_blob_release(b);
	}
	return NULL;
}

START_TEST(memory_tier_concurrent_references)
{
	enum { BLOBS = 16, THREADS = 4 };
	ap_cache *c = open_ok();
	uint8_t d[BLOBS][32], buf[1024];
	struct ref_reader r[THREADS];
	ap_cache_counts n;

	ap_cache_set_limits(c, 0, 4 * sizeof(buf));   /* 4 of the 16 blobs fit */
	for (int i = 0; i < BLOBS; i++) {
		memset(buf, i, sizeof(buf));
		buf[0] = (uint8_t)(i * 7 + 1);
		ck_assert_int_eq(ap_cache_blob_put(c, buf, sizeof(buf), d[i]), 0);
	}
	for (int i = 0; i < THREADS; i++) {
		r[i] = (struct ref_reader){ .c = c, .d = d, .n_blobs = BLOBS, .seed = i + 1 };
		pthread_create(&r[i].th, NULL, ref_reader_main, &r[i]);
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(r[i].th, NULL);
		ck_assert_int_eq(r[i].bad, 0);
	}
	ap_cache_get_counts(c, &n);
	ck_assert_uint_le(n.memory_bytes, 4 * sizeof(buf));
	ck_assert_uint_gt(n.memory_hits, 0);
	ap_cache_free(c);
}
END_TEST

/* ---- no room (issue 29, item 6) ------------------------------------------------- */

/* ap_cache_put of `n` bytes of `fill` under `key`: its result. */
static int put_fill(ap_cache *c, const char *key, int fill, size_t n)
{
	uint8_t k[32], *v = malloc(n);
	int rc;

	ck_assert_ptr_nonnull(v);
	memset(v, fill, n);
	key_of(key, k);
	rc = ap_cache_put(c, k, v, n);
	free(v);
	return rc;
}

/* Whether `key` reads back as exactly `n` bytes of `fill`. */
static bool holds(ap_cache *c, const char *key, int fill, size_t n)
{
	uint8_t k[32], *v = NULL;
	size_t len = 0;
	bool ok;

	key_of(key, k);
	if (ap_cache_get(c, k, &v, &len) != 1)
		return false;
	ok = len == n;
	for (size_t i = 0; ok && i < n; i++)
		ok = v[i] == (uint8_t)fill;
	free(v);
	return ok;
}

static ap_cache_counts counts(ap_cache *c)
{
	ap_cache_counts n;

	ap_cache_get_counts(c, &n);
	return n;
}

static void set_fsize(rlim_t soft)
{
	struct rlimit rl;

	ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &rl), 0);
	rl.rlim_cur = soft;
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
}

/* A real file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored as apollod does):
 * a write past it fails with EFBIG; the cache is degraded, not off: reads
 * hit, writes are skipped until each retry, the retries 1, 2, 4 ... s
 * apart up to 60 s (the cache's clock is the test's), and once the limit
 * is raised the next retry succeeds and the cache is whole again.  No room
 * again within a minute goes on from the last wait; later, from 1 s. */
START_TEST(file_size_limit_degrades)
{
	static const int64_t retries[] = { 1001, 1003, 1007, 1015, 1031, 1063, 1123, 1183 };
	struct rlimit saved;
	ap_cache *c = open_ok();
	ap_cache_counts n;
	char key[32];

	ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
	ck_assert(saved.rlim_max == RLIM_INFINITY);
	signal(SIGXFSZ, SIG_IGN);
	ap__cache_set_time(c, 1000);
	for (int i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "before %d", i);
		ck_assert_int_eq(put_fill(c, key, 'a' + i, 3000), 0);
	}
	/* below the size of every file of the cache: no write fits */
	set_fsize(4096);
	ck_assert_int_eq(put_fill(c, "refused", 'r', 3000), AP_EIO);
	n = counts(c);
	ck_assert(n.degraded);
	ck_assert(ap_cache_enabled(c));
	ck_assert_uint_eq(n.space_failures, 1);
	ck_assert_uint_eq(n.skipped_writes, 0);
	ck_assert_uint_eq(n.actions, 4);            /* the failed write was rolled back */
	ck_assert_uint_eq(n.blobs, 4);
	ck_assert_uint_eq(n.blob_bytes, 4 * 3000);
	for (int i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "before %d", i);
		ck_assert_msg(holds(c, key, 'a' + i, 3000), "%s lost", key);
	}
	ck_assert(!holds(c, "refused", 'r', 3000));
	/* skipped while it lasts: nothing reaches the file */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(put_fill(c, "skipped", 's', 100), AP_EBUSY);
	n = counts(c);
	ck_assert_uint_eq(n.skipped_writes, 3);
	ck_assert_uint_eq(n.space_failures, 1);

	/* the retries: 1 s after the failure, then doubling, at most 60 s
	 * apart; each fails (still no room) and the writes between them are
	 * skipped */
	for (size_t r = 0; r < sizeof(retries) / sizeof(retries[0]); r++) {
		ap__cache_set_time(c, retries[r] - 1);
		ck_assert_int_eq(put_fill(c, "skipped", 's', 100), AP_EBUSY);
		ap__cache_set_time(c, retries[r]);
		ck_assert_msg(put_fill(c, "retry", 't', 100) == AP_EIO, "no retry at %lld",
			      (long long)retries[r]);
		ck_assert_int_eq(put_fill(c, "skipped", 's', 100), AP_EBUSY);   /* one at a time */
	}
	n = counts(c);
	ck_assert(n.degraded);
	ck_assert_uint_eq(n.space_failures, 1 + 8);
	ck_assert_uint_eq(n.skipped_writes, 3 + 2 * 8);

	/* room again: the next retry (60 s on) succeeds, the cache is whole */
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
	ap__cache_set_time(c, 1242);
	ck_assert_int_eq(put_fill(c, "skipped", 's', 100), AP_EBUSY);
	ap__cache_set_time(c, 1243);
	ck_assert_int_eq(put_fill(c, "after 0", 'x', 3000), 0);
	ck_assert(!counts(c).degraded);
	ck_assert_int_eq(put_fill(c, "after 1", 'y', 3000), 0);   /* at once */
	ck_assert(holds(c, "after 0", 'x', 3000));
	ck_assert(holds(c, "after 1", 'y', 3000));
	ck_assert(!holds(c, "skipped", 's', 100));
	n = counts(c);
	ck_assert_uint_eq(n.actions, 6);
	ck_assert_uint_eq(n.blobs, 6);
	ck_assert_uint_eq(n.skipped_writes, 3 + 2 * 8 + 1);

	/* no room again within a minute: the wait goes on from 60 s */
	set_fsize(4096);
	ap__cache_set_time(c, 1250);
	ck_assert_int_eq(put_fill(c, "refused", 'r', 3000), AP_EIO);
	ap__cache_set_time(c, 1309);
	ck_assert_int_eq(put_fill(c, "skipped", 's', 100), AP_EBUSY);
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
	ap__cache_set_time(c, 1310);
	ck_assert_int_eq(put_fill(c, "after 2", 'z', 3000), 0);
	/* ... a minute later, from 1 s again */
	set_fsize(4096);
	ap__cache_set_time(c, 1371);
	ck_assert_int_eq(put_fill(c, "refused", 'r', 3000), AP_EIO);
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
	ck_assert_int_eq(put_fill(c, "skipped", 's', 100), AP_EBUSY);
	ap__cache_set_time(c, 1372);
	ck_assert_int_eq(put_fill(c, "after 3", 'v', 3000), 0);
	n = counts(c);
	ck_assert(!n.degraded);
	ck_assert_uint_eq(n.space_failures, 1 + 8 + 2);
	ck_assert_uint_eq(n.actions, 8);
	ap_cache_free(c);

	/* nothing was lost or broken: a new open finds all eight */
	c = open_ok();
	n = counts(c);
	ck_assert_uint_eq(n.actions, 8);
	ck_assert(!n.degraded);
	for (int i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "before %d", i);
		ck_assert(holds(c, key, 'a' + i, 3000));
	}
	ck_assert(holds(c, "after 1", 'y', 3000));
	ck_assert(holds(c, "after 2", 'z', 3000));
	ck_assert(holds(c, "after 3", 'v', 3000));
	ap_cache_free(c);
	{
		char marker[160];

		snprintf(marker, sizeof(marker), "%s.corrupt", db);
		ck_assert_int_ne(access(marker, F_OK), 0);
	}
}
END_TEST

/* Mounts a tmpfs of `size` bytes at `at` in a mount namespace of this
 * process only (the test runs in its own process, check's fork mode).
 * Needs root: in a user namespace the real root's directories (/, /tmp)
 * show as uid 65534, which the cache's ownership rule refuses.  false,
 * with `why`, where it cannot. */
static bool private_tmpfs(const char *at, size_t size, char *why, size_t cap)
{
	const char *fork_mode = getenv("CK_FORK");
	char opts[64];

	if (fork_mode && !strcmp(fork_mode, "no")) {
		snprintf(why, cap, "CK_FORK=no: the mount would outlive the test");
		return false;
	}
	if (unshare(CLONE_NEWNS)) {
		snprintf(why, cap, "no mount namespace (needs root): %s", strerror(errno));
		return false;
	}
	/* nothing mounted here may show outside this process */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) {
		snprintf(why, cap, "cannot make / private: %s", strerror(errno));
		return false;
	}
	snprintf(opts, sizeof(opts), "size=%zu,mode=0700", size);
	if (mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, opts)) {
		snprintf(why, cap, "cannot mount a tmpfs: %s", strerror(errno));
		return false;
	}
	return true;
}

/* A real full file system (a 1 MiB tmpfs, ENOSPC: SQLITE_FULL): the cache
 * is degraded, reads hit, writes are skipped and a retry while it is
 * still full fails; once a file is removed the next retry succeeds. */
START_TEST(disk_full_degrades)
{
	char small[96], filler[128], why[200], key[32];
	ap_cache *c = NULL;
	ap_cache_counts n;
	ap_error err;
	int stored = 0, rc = 0;
	FILE *f;

	snprintf(small, sizeof(small), "%s/small", dir);
	ck_assert_int_eq(mkdir(small, 0700), 0);
	if (!private_tmpfs(small, 1 << 20, why, sizeof(why))) {
		printf("disk_full_degrades: skipped: %s\n", why);
		fflush(stdout);
		return;
	}
	/* half of it taken by another file */
	snprintf(filler, sizeof(filler), "%s/filler", small);
	f = fopen(filler, "w");
	ck_assert_ptr_nonnull(f);
	for (int i = 0; i < 128; i++) {
		char page[4096];

		memset(page, 'f', sizeof(page));
		ck_assert_uint_eq(fwrite(page, 1, sizeof(page), f), sizeof(page));
	}
	ck_assert_int_eq(fclose(f), 0);
	snprintf(db, sizeof(db), "%s/cache.db", small);
	ck_assert_msg(ap_cache_open(db, &c, &err) == 0, "%s", err.msg);
	ap__cache_set_time(c, 1000);
	/* 16 KiB values until the file system is full */
	while (stored < 64) {
		snprintf(key, sizeof(key), "v%d", stored);
		if ((rc = put_fill(c, key, 'A' + stored % 26, 16384)))
			break;
		stored++;
	}
	ck_assert_int_eq(rc, AP_EIO);
	ck_assert_int_gt(stored, 4);
	ck_assert_int_lt(stored, 32);
	n = counts(c);
	ck_assert(n.degraded);
	ck_assert(ap_cache_enabled(c));
	ck_assert_uint_eq(n.space_failures, 1);
	ck_assert_uint_eq(n.actions, (uint64_t)stored);
	ck_assert_uint_eq(n.blob_bytes, (uint64_t)stored * 16384);
	for (int i = 0; i < stored; i++) {
		snprintf(key, sizeof(key), "v%d", i);
		ck_assert_msg(holds(c, key, 'A' + i % 26, 16384), "%s lost", key);
	}
	ck_assert_int_eq(put_fill(c, "skipped", 's', 100), AP_EBUSY);
	/* a retry while still full fails, and waits twice as long */
	ap__cache_set_time(c, 1001);
	ck_assert_int_eq(put_fill(c, "still full", 'z', 16384), AP_EIO);
	ap__cache_set_time(c, 1002);
	ck_assert_int_eq(put_fill(c, "skipped", 's', 100), AP_EBUSY);
	n = counts(c);
	ck_assert_uint_eq(n.space_failures, 2);
	ck_assert_uint_eq(n.skipped_writes, 2);

	/* space freed: the next retry succeeds */
	ck_assert_int_eq(unlink(filler), 0);
	ap__cache_set_time(c, 1003);
	ck_assert_int_eq(put_fill(c, "after", 'y', 16384), 0);
	ck_assert(!counts(c).degraded);
	ck_assert_int_eq(put_fill(c, "after 2", 'w', 16384), 0);
	ck_assert(holds(c, "after", 'y', 16384));
	ck_assert(holds(c, "after 2", 'w', 16384));
	ck_assert_uint_eq(counts(c).actions, (uint64_t)stored + 2);
	ap_cache_free(c);
	c = open_ok();
	ck_assert_uint_eq(counts(c).actions, (uint64_t)stored + 2);
	for (int i = 0; i < stored; i++) {
		snprintf(key, sizeof(key), "v%d", i);
		ck_assert(holds(c, key, 'A' + i % 26, 16384));
	}
	ap_cache_free(c);
	ck_assert_int_eq(umount(small), 0);
}
END_TEST

START_TEST(off_and_default_path)
{
	ap_cache *c = NULL;
	ap_error err;
	char buf[256];

	ck_assert_int_eq(ap_cache_open("off", &c, &err), 0);
	ck_assert(!ap_cache_enabled(c));
	ap_cache_free(c);
	ck_assert_ptr_null(ap_cache_free(NULL));

	setenv("XDG_CACHE_HOME", "/var/tmp/xdg", 1);
	ck_assert_int_eq(ap_cache_default_path(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/var/tmp/xdg/apollo/cache.db");
	setenv("XDG_CACHE_HOME", "relative/is/ignored", 1);
	setenv("HOME", "/home/someone", 1);
	ck_assert_int_eq(ap_cache_default_path(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/home/someone/.cache/apollo/cache.db");
	ck_assert_int_eq(ap_cache_default_path(buf, 8), AP_ETOOLARGE);
}
END_TEST

static Suite *cache_suite(void)
{
	Suite *s = suite_create("cache");
	TCase *tc = tcase_create("cache");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, put_get);
	tcase_add_test(tc, untrusted_database_refused);
	tcase_add_test(tc, persists_across_open);
	tcase_add_test(tc, digest_mismatch_is_a_miss);
	tcase_add_test(tc, kernel_shared_by_two_keys);
	tcase_add_test(tc, tiers_without_redis);
	tcase_add_test(tc, concurrent_writers);
	tcase_add_test(tc, unopenable_path_degrades);
	tcase_add_test(tc, garbage_file_is_replaced);
	tcase_add_test(tc, truncated_file_is_replaced);
	tcase_add_test(tc, io_error_at_run_time_degrades);
	tcase_add_test(tc, off_and_default_path);
	tcase_add_test(tc, lru_eviction);
	tcase_add_test(tc, schema_1_upgraded);
	tcase_add_test(tc, memory_tier);
	tcase_add_test(tc, memory_tier_references);
	tcase_add_test(tc, memory_tier_concurrent_references);
	tcase_add_test(tc, file_size_limit_degrades);
	tcase_add_test(tc, disk_full_degrades);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(cache_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
