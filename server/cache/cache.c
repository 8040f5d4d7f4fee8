/* cache.c -- the SQLite cache (see cache.h).  The only file that includes
 * sqlite3.h.
 *
 * Approach: a pool of connections, each with its prepared statements.  A
 * calling thread takes a connection from the pool (opening a new one when
 * the pool is empty), runs its statements, and gives it back, so no
 * connection is ever used by two threads at once (they are opened
 * SQLITE_OPEN_NOMUTEX).  Reads run in autocommit; every write is one
 * BEGIN IMMEDIATE ... COMMIT, which takes the file's write lock up front
 * so that two writers never deadlock on a lock upgrade; busy_timeout makes
 * a writer wait for another process instead of failing at once.
 *
 * Any result other than success, "busy/locked" or "no room" (I/O error,
 * corruption, not a database, read-only, a missing table) switches the
 * cache off for the rest of the process, with one warning: a broken cache
 * costs speed, never a request.
 *
 * No room (issue 29, item 6) is not broken: a write the file system
 * refuses for space -- SQLITE_FULL (a short write, ENOSPC), or a write-class
 * SQLITE_IOERR_* whose errno is ENOSPC, EFBIG (past RLIMIT_FSIZE, with
 * SIGXFSZ ignored) or EDQUOT -- makes the cache *degraded*: reads go on,
 * writes are skipped (AP_EBUSY, counted) until a retry time, first 1 s
 * after the failure, doubling with every retry that fails, at most 60 s
 * (BACKOFF_MIN_MS, BACKOFF_MAX_MS; the clock is ap__cache_set_time's in
 * tests); degraded again less than 60 s after it ended, the wait goes on
 * from where it was.  One store at a time is the retry; before it a passive
 * checkpoint moves the write-ahead log into the database, so that the log
 * can start again from its beginning (under a file-size limit the log is
 * the file that is full).  The first write that commits ends the degraded
 * state.  SQLite rolls the failed transaction back, so nothing stored
 * before is lost; the in-memory counts are read again from the file.
 * sqlite3_system_errno is not enough to tell EFBIG from EIO: SQLite
 * records it only for errors raised inside a statement, not for a failed
 * COMMIT (where the log is written), so check() reads errno, which every
 * write transaction clears first (begin()).
 *
 * A file that is not a database or is corrupt (garbage, truncated) must
 * not cost every later start its cache too: ap_cache_open moves such a
 * file aside (PATH.corrupt-TIME, with its -wal) and creates a fresh one.
 * Corruption that shows only at run time (a page read long after the
 * open) leaves a marker, PATH.corrupt, so that the next open does the
 * same even when its own checks pass.
 *
 * Size limit (issue 10): every blob row carries `last_used` (seconds), set
 * when it is stored and again when it is read, at most once a minute per
 * blob (TOUCH_S) so that a warm read rarely writes.  When the blobs' bytes
 * pass max_bytes, the least recently used blobs are deleted, with the
 * action and kernel rows that name them, until they are under 90% of it
 * (one transaction; the freed pages go back to the file system through
 * incremental auto-vacuum in files created since).  A bundle whose kernel
 * blob was evicted reads as a miss (its blobs are fetched by digest and one
 * is missing) and is compiled and stored again.  Schema 1 files gain the
 * column and the indexes at the first open (schema 2).
 *
 * The memory tier (hot.h) holds blobs read and verified from the file, so
 * that a hot bundle is not read and hashed again on every request; reads
 * served from it still mark the file's row used (once a minute).
 */
#include "cache.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../common/graph.h"
#include "../config.h"
#include "hot.h"
#include "../../common/trust.h"

#define SCHEMA_VERSION "2"
#define BUSY_TIMEOUT_MS 10000
#define TOUCH_S 60          /* a blob's last_used is rewritten at most this often */
#define EVICT_BATCH 32      /* LRU rows looked at per query while evicting */
#define BACKOFF_MIN_MS 1000     /* degraded: the first retry of writes */
#define BACKOFF_MAX_MS 60000    /* ... doubling up to this */

enum {
	ST_BEGIN, ST_COMMIT, ST_ROLLBACK,
	ST_BLOB_GET, ST_BLOB_PUT, ST_BLOB_DEL, ST_BLOB_SET, ST_BLOB_TOUCH,
	ST_ACTION_GET, ST_ACTION_PUT, ST_ACTION_DEL_DIGEST,
	ST_KERNEL_GET, ST_KERNEL_PUT, ST_KERNEL_DEL_DIGEST,
	ST_LRU, ST_TOTAL,
	ST_TUNE_GET_ANY, ST_TUNE_GET_DEV, ST_TUNE_PUT, ST_TUNE_GEN, ST_TUNE_BUMP,
	ST_COUNT
};

#define TUNE_COLS "device, sms, emitter, config, modelled_us, measured_us, method, tried, candidates"

static const char *const stmt_sql[ST_COUNT] = {
	[ST_BEGIN] = "BEGIN IMMEDIATE",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
	[ST_BLOB_GET] = "SELECT data, last_used FROM blobs WHERE digest = ?1",
	[ST_BLOB_PUT] = "INSERT OR IGNORE INTO blobs(digest, size, data, last_used) VALUES (?1, ?2, ?3, ?4)",
	[ST_BLOB_DEL] = "DELETE FROM blobs WHERE digest = ?1",
	[ST_BLOB_SET] = "UPDATE blobs SET data = ?2 WHERE digest = ?1",
	[ST_BLOB_TOUCH] = "UPDATE blobs SET last_used = ?2 WHERE digest = ?1",
	[ST_ACTION_GET] = "SELECT digest FROM actions WHERE key = ?1",
	[ST_ACTION_PUT] = "INSERT OR REPLACE INTO actions(key, digest, created) VALUES (?1, ?2, ?3)",
	[ST_ACTION_DEL_DIGEST] = "DELETE FROM actions WHERE digest = ?1",
	[ST_KERNEL_GET] = "SELECT digest FROM kernels WHERE key = ?1",
	[ST_KERNEL_PUT] = "INSERT OR REPLACE INTO kernels(key, digest, created) VALUES (?1, ?2, ?3)",
	[ST_KERNEL_DEL_DIGEST] = "DELETE FROM kernels WHERE digest = ?1",
	[ST_LRU] = "SELECT digest, size FROM blobs ORDER BY last_used, rowid LIMIT 32",
	[ST_TOTAL] = "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM blobs",
	/* a measured record before a modelled one; the newest measurement */
	[ST_TUNE_GET_ANY] = "SELECT " TUNE_COLS " FROM tuning WHERE sig = ?1 AND target = ?2"
			    " ORDER BY measured_us IS NULL, created DESC LIMIT 1",
	[ST_TUNE_GET_DEV] = "SELECT " TUNE_COLS " FROM tuning WHERE sig = ?1 AND target = ?2"
			    " AND device = ?3 ORDER BY created DESC LIMIT 1",
	[ST_TUNE_PUT] = "INSERT OR REPLACE INTO tuning(sig, target, device, sms, emitter, config,"
			" modelled_us, measured_us, method, tried, candidates, created)"
			" VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
	[ST_TUNE_GEN] = "SELECT v FROM meta WHERE k = 'tuning_generation'",
	[ST_TUNE_BUMP] = ("INSERT INTO meta(k, v) VALUES ('tuning_generation', '1')"
			  " ON CONFLICT(k) DO UPDATE SET v = CAST(CAST(v AS INTEGER) + 1 AS TEXT)"),
};

static const char schema_sql[] =
	"CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS blobs(digest BLOB PRIMARY KEY, size INTEGER NOT NULL,"
	" data BLOB NOT NULL, last_used INTEGER NOT NULL DEFAULT 0);"
	"CREATE TABLE IF NOT EXISTS actions(key BLOB PRIMARY KEY, digest BLOB NOT NULL,"
	" created INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS kernels(key BLOB PRIMARY KEY, digest BLOB NOT NULL,"
	" created INTEGER NOT NULL);"
	/* tuning records (issue 9): a kernel signature's chosen configuration
	 * per target; device '' and sms 0 for the cost model's record, a
	 * device's name and SM count for a measured one */
	"CREATE TABLE IF NOT EXISTS tuning(sig BLOB NOT NULL, target TEXT NOT NULL,"
	" device TEXT NOT NULL, sms INTEGER NOT NULL, emitter TEXT NOT NULL, config TEXT NOT NULL,"
	" modelled_us REAL NOT NULL, measured_us REAL, method TEXT NOT NULL, tried INTEGER NOT NULL,"
	" candidates TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(sig, target, device));"
	/* clients' tuning reports (issue 29): one row per client, device,
	 * kernel and schedule; a measured record needs two clients' agreement */
	"CREATE TABLE IF NOT EXISTS tune_reports(sig BLOB NOT NULL, target TEXT NOT NULL,"
	" device TEXT NOT NULL, reporter TEXT NOT NULL, schedule TEXT NOT NULL,"
	" time_us REAL NOT NULL, created INTEGER NOT NULL,"
	" PRIMARY KEY(sig, target, device, reporter, schedule));"
	/* which tuned kernels each cached bundle holds, for which device: a
	 * record that changes retires only those bundles */
	"CREATE TABLE IF NOT EXISTS bundle_tuned(key BLOB NOT NULL, sig BLOB NOT NULL,"
	" target TEXT NOT NULL, device TEXT NOT NULL, PRIMARY KEY(key, sig));"
	"INSERT OR IGNORE INTO meta(k, v) VALUES ('schema', '" SCHEMA_VERSION "');";

/* Schema 1 -> 2: blobs gain last_used (0: used before anything else). */
static const char upgrade_1_sql[] =
	"ALTER TABLE blobs ADD COLUMN last_used INTEGER NOT NULL DEFAULT 0;"
	"UPDATE meta SET v = '2' WHERE k = 'schema';";

/* Every schema: the indexes eviction needs. */
static const char index_sql[] =
	"CREATE INDEX IF NOT EXISTS blobs_lru ON blobs(last_used);"
	"CREATE INDEX IF NOT EXISTS actions_digest ON actions(digest);"
	"CREATE INDEX IF NOT EXISTS kernels_digest ON kernels(digest);"
	"CREATE INDEX IF NOT EXISTS tune_reports_age ON tune_reports(created);"
	"CREATE INDEX IF NOT EXISTS tuning_age ON tuning(created);"
	"CREATE INDEX IF NOT EXISTS bundle_tuned_sig ON bundle_tuned(sig, target);";

struct conn {
	sqlite3 *db;
	sqlite3_stmt *st[ST_COUNT];
	bool retrying;               /* this operation is the degraded cache's retry */
	struct conn *next;
};

struct ap_cache {
	char path[PATH_MAX];
	pthread_mutex_t mu;
	struct conn *pool;           /* idle connections, under mu */
	atomic_bool enabled;
	atomic_uint_fast64_t actions, kernels, blobs, blob_bytes, tuning;
	atomic_uint_fast64_t retired;  /* bundles retired by tuning changes */
	atomic_uint_fast64_t evicted_blobs, evicted_bytes;
	atomic_uint_fast64_t max_bytes;     /* 0: no limit */
	atomic_int_fast64_t fake_now;       /* tests: the clock, when not 0 */
	ap_hot *hot;                 /* memory tier; NULL: none */
	/* no room (degraded): the flag is read without the lock, the rest
	 * under mu */
	atomic_bool degraded;
	atomic_bool recount;                /* counts to read again from the file */
	atomic_uint_fast64_t skipped_writes, space_failures;
	int64_t backoff_ms, retry_at_ms;
	int64_t recovered_ms;               /* when the last degraded state ended */
};

/* Seconds, for last_used. */
static int64_t now_s(ap_cache *c)
{
	int64_t t = atomic_load(&c->fake_now);

	return t ? t : (int64_t)time(NULL);
}

/* Milliseconds, for the degraded state's retries (monotonic, or the
 * tests' clock). */
static int64_t now_ms(ap_cache *c)
{
	int64_t t = atomic_load(&c->fake_now);

	return t ? t * 1000 : (int64_t)ap_now_ms();
}

int ap_cache_default_path(char *buf, size_t cap)
{
	const char *xdg = getenv("XDG_CACHE_HOME");
	const char *home = getenv("HOME");
	int n;

	if (xdg && xdg[0] == '/') {
		n = snprintf(buf, cap, "%s/apollo/cache.db", xdg);
	} else {
		if (!home || !*home) {
			struct passwd pw, *res = NULL;
			char tmp[1024];
			if (getpwuid_r(getuid(), &pw, tmp, sizeof(tmp), &res) || !res)
				return AP_EIO;
			n = snprintf(buf, cap, "%s/.cache/apollo/cache.db", res->pw_dir);
			return n < 0 || (size_t)n >= cap ? AP_ETOOLARGE : 0;
		}
		n = snprintf(buf, cap, "%s/.cache/apollo/cache.db", home);
	}
	return n < 0 || (size_t)n >= cap ? AP_ETOOLARGE : 0;
}

/* mkdir -p of the directory part of `path`, mode 0700. */
static int make_parent_dirs(const char *path)
{
	char dir[PATH_MAX];
	size_t n = strlen(path);

	if (n >= sizeof(dir))
		return -ENAMETOOLONG;
	memcpy(dir, path, n + 1);
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(dir, 0700) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

static void conn_close(struct conn *co)
{
	if (!co)
		return;
	for (int i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(co->st[i]);
	sqlite3_close(co->db);
	free(co);
}

static bool is_corruption(int rc)
{
	return (rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB;
}

/* PATH + suffix into buf; false when it does not fit. */
static bool path_with(char *buf, size_t cap, const char *path, const char *suffix)
{
	int n = snprintf(buf, cap, "%s%s", path, suffix);

	return n > 0 && (size_t)n < cap;
}

/* Leaves the marker that makes the next open replace the file. */
static void mark_corrupt(const char *path)
{
	char marker[PATH_MAX + 16];
	FILE *f;

	if (path_with(marker, sizeof(marker), path, ".corrupt") && (f = fopen(marker, "w")))
		fclose(f);
}

/* Moves a broken database (and its write-ahead log) aside as
 * PATH.corrupt-TIME[-wal], drops its shared-memory index and the marker.
 * 0, or -errno when the database itself could not be moved. */
static int quarantine(const char *path, const char *why)
{
	char dst[PATH_MAX + 48], src[PATH_MAX + 16], suffix[40], wal_suffix[48];

	snprintf(suffix, sizeof(suffix), ".corrupt-%lld", (long long)time(NULL));
	snprintf(wal_suffix, sizeof(wal_suffix), "%s-wal", suffix);
	if (!path_with(dst, sizeof(dst), path, suffix))
		return -ENAMETOOLONG;
	if (rename(path, dst) && errno != ENOENT)
		return -errno;
	ap_log(AP_LOG_WARN, "cache %s: %s; moved it to %s and starting a new cache", path, why, dst);
	if (path_with(src, sizeof(src), path, "-wal") &&
	    path_with(dst, sizeof(dst), path, wal_suffix))
		rename(src, dst);
	if (path_with(src, sizeof(src), path, "-shm"))
		unlink(src);
	if (path_with(src, sizeof(src), path, ".corrupt"))
		unlink(src);
	return 0;
}

/* Turns the cache off, logging why once. */
static void turn_off(ap_cache *c, const char *what, const char *why)
{
	bool was = true;

	if (atomic_compare_exchange_strong(&c->enabled, &was, false))
		ap_log(AP_LOG_WARN, "cache %s: %s: %s; caching is off from now on", c->path, what,
		       why);
}

/* Whether SQLite result `rc`, with `err` the errno the failed call left,
 * says that the file system had no room for a write: SQLITE_FULL (SQLite's
 * word for ENOSPC and short writes), or a write, sync, truncate or
 * shared-memory growth that failed with ENOSPC, EFBIG or EDQUOT. */
static bool is_no_room(int rc, int err)
{
	if ((rc & 0xff) == SQLITE_FULL)
		return true;
	if (rc != SQLITE_IOERR && rc != SQLITE_IOERR_WRITE && rc != SQLITE_IOERR_FSYNC &&
	    rc != SQLITE_IOERR_DIR_FSYNC && rc != SQLITE_IOERR_TRUNCATE &&
	    rc != SQLITE_IOERR_SHMSIZE)
		return false;
	return err == ENOSPC || err == EFBIG || err == EDQUOT;
}

/* No room for a write: enters the degraded state (logged once) with the
 * first retry BACKOFF_MIN_MS from now; a failed retry doubles the wait, up
 * to BACKOFF_MAX_MS.  Degraded again within BACKOFF_MAX_MS of the end of
 * the last degraded state (a checkpoint made room for a while), the wait
 * goes on doubling from the last one, so that a cache at its limit does
 * not flap every second.  A write that was already under way when another
 * failed leaves the retry time as it is. */
static void degrade(ap_cache *c, struct conn *co, const char *what, const char *why)
{
	int64_t now = now_ms(c), wait;
	bool was;

	pthread_mutex_lock(&c->mu);
	was = atomic_load(&c->degraded);
	if (!was && c->backoff_ms && now - c->recovered_ms < BACKOFF_MAX_MS)
		c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
								   : c->backoff_ms * 2;
	else if (!was)
		c->backoff_ms = BACKOFF_MIN_MS;
	else if (co && co->retrying)
		c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
								   : c->backoff_ms * 2;
	if (!was || (co && co->retrying))
		c->retry_at_ms = now + c->backoff_ms;
	wait = c->retry_at_ms - now;
	atomic_store(&c->degraded, true);
	pthread_mutex_unlock(&c->mu);
	atomic_fetch_add(&c->space_failures, 1);
	atomic_store(&c->recount, true);
	if (!was)
		ap_log(AP_LOG_WARN, "cache %s: %s: %s; no room: the cache is degraded -- reads go on, "
		       "writes are skipped and tried again in %lld ms (the wait doubling up to %d s)",
		       c->path, what, why, (long long)wait, BACKOFF_MAX_MS / 1000);
	else
		ap_log(AP_LOG_INFO, "cache %s: %s: %s; still no room, writes tried again in %lld ms",
		       c->path, what, why, (long long)wait);
}

/* A write transaction committed: the degraded state, if any, ends. */
static void write_ok(ap_cache *c)
{
	bool was = true;

	if (!atomic_load(&c->degraded))
		return;
	pthread_mutex_lock(&c->mu);
	if (atomic_compare_exchange_strong(&c->degraded, &was, false))
		c->recovered_ms = now_ms(c);   /* backoff_ms kept: see degrade() */
	pthread_mutex_unlock(&c->mu);
	if (was)
		ap_log(AP_LOG_WARN, "cache %s: a write succeeded again; the cache is no longer "
		       "degraded (%llu writes were skipped)", c->path,
		       (unsigned long long)atomic_load(&c->skipped_writes));
}

/* Classifies an SQLite result: 0 for success, AP_EBUSY for a lost lock
 * race (the operation is skipped), AP_EIO after entering the degraded
 * state for no room (degrade()), else AP_EIO after turning the cache off.
 * Reads errno first: call it before anything that may fail. */
static int check(ap_cache *c, struct conn *co, int rc, const char *what)
{
	int err = errno;

	if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE)
		return 0;
	if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) {
		ap_log(AP_LOG_DEBUG, "cache %s: %s: busy, skipped", c->path, what);
		return AP_EBUSY;
	}
	if (is_no_room(rc, err)) {
		char why[200];

		snprintf(why, sizeof(why), "%s (%s)",
			 co ? sqlite3_errmsg(co->db) : sqlite3_errstr(rc),
			 (rc & 0xff) == SQLITE_FULL ? "disk full" : strerror(err));
		degrade(c, co, what, why);
		return AP_EIO;
	}
	if (is_corruption(rc))
		mark_corrupt(c->path);
	turn_off(c, what, co ? sqlite3_errmsg(co->db) : sqlite3_errstr(rc));
	return AP_EIO;
}

static int exec_simple(struct conn *co, const char *sql, char **errmsg)
{
	return sqlite3_exec(co->db, sql, NULL, NULL, errmsg);
}

/* Inside a transaction: creates the tables, upgrades schema 1, adds the
 * indexes.  An SQLite result, or AP_EINVAL with `why` set when the file
 * holds a schema this build does not know. */
static int setup_schema(struct conn *co, char *why, size_t cap, char **msg)
{
	sqlite3_stmt *st = NULL;
	char version[16] = "";
	int rc = exec_simple(co, schema_sql, msg);

	if (rc != SQLITE_OK)
		return rc;
	rc = sqlite3_prepare_v2(co->db, "SELECT v FROM meta WHERE k = 'schema'", -1, &st, NULL);
	if (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
		const unsigned char *v = sqlite3_column_text(st, 0);

		snprintf(version, sizeof(version), "%s", v ? (const char *)v : "");
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_OK)
		return rc;
	if (!strcmp(version, "1"))
		rc = exec_simple(co, upgrade_1_sql, msg);
	else if (strcmp(version, SCHEMA_VERSION)) {
		snprintf(why, cap, "schema version '%.15s' is not " SCHEMA_VERSION, version);
		return AP_EINVAL;
	}
	if (rc == SQLITE_OK)
		rc = exec_simple(co, index_sql, msg);
	return rc;
}

/* The database file and SQLite's files beside it (-wal, -shm, -journal)
 * by common/trust.h's rule: the file may be missing (it is created), each
 * one present must be this user's or root's and writable by nobody else,
 * and its directory writable by nobody else.  0 or AP_EIO with `err`. */
static int trust_files(const char *path, ap_error *err)
{
	static const char *const sides[] = { "-wal", "-shm", "-journal" };
	char side[PATH_MAX + 16];
	int rc = ap_trust_path(path, "cache database",
				   AP_TRUST_MAY_BE_MISSING | AP_TRUST_PRIVATE_DIR, err);

	for (size_t i = 0; !rc && i < sizeof(sides) / sizeof(sides[0]); i++)
		if (path_with(side, sizeof(side), path, sides[i]) && access(side, F_OK) == 0)
			rc = ap_trust_path(side, "cache database", AP_TRUST_PRIVATE_DIR, err);
	return rc;
}

int ap_cache_check_path(const char *path, ap_error *err)
{
	char buf[PATH_MAX];

	if (path && !strcmp(path, "off"))
		return 0;
	if (!path || !*path) {
		if (ap_cache_default_path(buf, sizeof(buf)))
			return ap_error_set(err, AP_EIO, NULL, NULL,
					    "no cache path: neither XDG_CACHE_HOME nor HOME is usable");
		path = buf;
	}
	return trust_files(path, err);
}

/* Opens one connection; `setup` creates the schema (first connection).
 * On failure returns NULL with `why` filled and *code the SQLite result
 * (0 when the failure was not SQLite's). */
static struct conn *conn_open(const char *path, bool setup, char *why, size_t cap, int *code)
{
	struct conn *co = calloc(1, sizeof(*co));
	char *msg = NULL;
	int rc = SQLITE_OK;

	if (!co) {
		snprintf(why, cap, "out of memory");
		return NULL;
	}
	{
		/* before each open: another user's file must never be read */
		ap_error terr;

		if (trust_files(path, &terr)) {
			snprintf(why, cap, "%s", terr.msg);
			goto error;
		}
	}
	rc = sqlite3_open_v2(path, &co->db,
			     SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK) {
		snprintf(why, cap, "cannot open: %s",
			 co->db ? sqlite3_errmsg(co->db) : sqlite3_errstr(rc));
		goto error;
	}
	sqlite3_busy_timeout(co->db, BUSY_TIMEOUT_MS);
	sqlite3_extended_result_codes(co->db, 1);
	if (setup) {
		/* auto_vacuum only takes in a file that has no table yet */
		rc = exec_simple(co, "PRAGMA auto_vacuum=INCREMENTAL", &msg);
		if (rc == SQLITE_OK)
			rc = exec_simple(co, "PRAGMA journal_mode=WAL", &msg);
		if (rc == SQLITE_OK)
			rc = exec_simple(co, "BEGIN IMMEDIATE", &msg);
		if (rc == SQLITE_OK) {
			rc = setup_schema(co, why, cap, &msg);
			if (rc == SQLITE_OK)
				rc = exec_simple(co, "COMMIT", &msg);
			else
				exec_simple(co, "ROLLBACK", NULL);
		}
		if (rc == AP_EINVAL) {   /* `why` says it */
			rc = SQLITE_OK;
			goto error;
		}
		if (rc != SQLITE_OK) {
			snprintf(why, cap, "cannot set up: %s", msg ? msg : sqlite3_errstr(rc));
			goto error;
		}
	}
	rc = exec_simple(co, "PRAGMA synchronous=NORMAL", &msg);
	if (rc != SQLITE_OK) {
		snprintf(why, cap, "%s", msg ? msg : sqlite3_errstr(rc));
		goto error;
	}
	for (int i = 0; i < ST_COUNT; i++) {
		rc = sqlite3_prepare_v3(co->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
					&co->st[i], NULL);
		if (rc != SQLITE_OK) {
			snprintf(why, cap, "cannot prepare statements: %s", sqlite3_errmsg(co->db));
			goto error;
		}
	}
	return co;
error:
	*code = rc;
	sqlite3_free(msg);
	conn_close(co);
	return NULL;
}

/* The tuning table's row count, after a write. */
static void count_tuning(ap_cache *c, struct conn *co)
{
	sqlite3_stmt *st = NULL;

	if (sqlite3_prepare_v2(co->db, "SELECT COUNT(*) FROM tuning", -1, &st, NULL) == SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW)
		atomic_store(&c->tuning, (uint64_t)sqlite3_column_int64(st, 0));
	sqlite3_finalize(st);
}

static int count_rows(ap_cache *c, struct conn *co)
{
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(co->db,
				    "SELECT (SELECT COUNT(*) FROM actions), (SELECT COUNT(*) FROM kernels),"
				    " (SELECT COUNT(*) FROM blobs), (SELECT COALESCE(SUM(size), 0) FROM blobs),"
				    " (SELECT COUNT(*) FROM tuning)",
				    -1, &st, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		atomic_store(&c->actions, (uint64_t)sqlite3_column_int64(st, 0));
		atomic_store(&c->kernels, (uint64_t)sqlite3_column_int64(st, 1));
		atomic_store(&c->blobs, (uint64_t)sqlite3_column_int64(st, 2));
		atomic_store(&c->blob_bytes, (uint64_t)sqlite3_column_int64(st, 3));
		atomic_store(&c->tuning, (uint64_t)sqlite3_column_int64(st, 4));
		rc = SQLITE_OK;
	}
	sqlite3_finalize(st);
	return rc;
}

int ap_cache_open(const char *path, ap_cache **out, ap_error *err)
{
	ap_cache *c = calloc(1, sizeof(*c));
	struct conn *co;
	char why[600], marker[PATH_MAX + 16];
	int rc;

	*out = NULL;
	if (!c)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory opening the cache");
	pthread_mutex_init(&c->mu, NULL);
	atomic_init(&c->enabled, false);
	*out = c;
	if (path && !strcmp(path, "off"))
		return 0;
	if (!path || !*path) {
		rc = ap_cache_default_path(c->path, sizeof(c->path));
		if (rc)
			return ap_error_set(err, AP_EIO, NULL, NULL,
					    "no cache path: neither XDG_CACHE_HOME nor HOME is usable");
	} else if (strlen(path) >= sizeof(c->path)) {
		return ap_error_set(err, AP_EIO, NULL, NULL, "cache path is too long");
	} else {
		snprintf(c->path, sizeof(c->path), "%s", path);
	}
	rc = make_parent_dirs(c->path);
	if (rc)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cache %s: cannot create its directory: %s",
				    c->path, strerror(-rc));
	/* A broken file found now, or marked at run time, is replaced once. */
	if (path_with(marker, sizeof(marker), c->path, ".corrupt") && access(marker, F_OK) == 0 &&
	    (rc = quarantine(c->path, "marked corrupt by an earlier run")))
		return ap_error_set(err, AP_EIO, NULL, NULL, "cache %s: cannot move it aside: %s",
				    c->path, strerror(-rc));
	for (int attempt = 0;; attempt++) {
		int code = SQLITE_OK;

		co = conn_open(c->path, true, why, sizeof(why), &code);
		if (co && (code = count_rows(c, co)) != SQLITE_OK) {
			snprintf(why, sizeof(why), "cannot count entries: %s", sqlite3_errmsg(co->db));
			conn_close(co);
			co = NULL;
		}
		if (co)
			break;
		if (attempt > 0 || !is_corruption(code))
			return ap_error_set(err, AP_EIO, NULL, NULL, "cache %s: %s", c->path, why);
		if ((rc = quarantine(c->path, why)))
			return ap_error_set(err, AP_EIO, NULL, NULL,
					    "cache %s: %s; cannot move it aside: %s", c->path, why,
					    strerror(-rc));
	}
	c->pool = co;
	atomic_store(&c->enabled, true);
	return 0;
}

ap_cache *ap_cache_free(ap_cache *c)
{
	if (!c)
		return NULL;
	while (c->pool) {
		struct conn *co = c->pool;
		c->pool = co->next;
		conn_close(co);
	}
	ap_hot_free(c->hot);
	pthread_mutex_destroy(&c->mu);
	free(c);
	return NULL;
}

bool ap_cache_enabled(const ap_cache *c)
{
	return c && atomic_load(&((ap_cache *)c)->enabled);
}

const char *ap_cache_path(const ap_cache *c)
{
	return c ? c->path : "";
}

void ap_cache_get_counts(const ap_cache *c, ap_cache_counts *out)
{
	ap_cache *m = (ap_cache *)c;

	memset(out, 0, sizeof(*out));
	if (!c)
		return;
	out->actions = atomic_load(&m->actions);
	out->kernels = atomic_load(&m->kernels);
	out->blobs = atomic_load(&m->blobs);
	out->blob_bytes = atomic_load(&m->blob_bytes);
	out->tuning = atomic_load(&m->tuning);
	out->retired = atomic_load(&m->retired);
	out->max_bytes = atomic_load(&m->max_bytes);
	out->evicted_blobs = atomic_load(&m->evicted_blobs);
	out->evicted_bytes = atomic_load(&m->evicted_bytes);
	out->degraded = atomic_load(&m->degraded);
	out->skipped_writes = atomic_load(&m->skipped_writes);
	out->space_failures = atomic_load(&m->space_failures);
	if (m->hot) {
		ap_hot_counts h;

		ap_hot_get_counts(m->hot, &h);
		out->memory_blobs = h.blobs;
		out->memory_bytes = h.bytes;
		out->memory_hits = h.hits;
	}
}

/* Takes an idle connection or opens one; NULL when the cache is off. */
static struct conn *acquire(ap_cache *c)
{
	struct conn *co;
	char why[600];
	int rc;

	if (!ap_cache_enabled(c))
		return NULL;
	pthread_mutex_lock(&c->mu);
	co = c->pool;
	if (co)
		c->pool = co->next;
	pthread_mutex_unlock(&c->mu);
	if (co)
		return co;
	co = conn_open(c->path, false, why, sizeof(why), &rc);
	if (!co)
		turn_off(c, "opening a connection", why);
	return co;
}

static void release(ap_cache *c, struct conn *co)
{
	if (!co)
		return;
	co->retrying = false;
	/* after a write that found no room: the counts it moved were rolled
	 * back with it */
	if (atomic_exchange(&c->recount, false) && count_rows(c, co) != SQLITE_OK)
		atomic_store(&c->recount, true);
	pthread_mutex_lock(&c->mu);
	co->next = c->pool;
	c->pool = co;
	pthread_mutex_unlock(&c->mu);
}

/* Steps a prepared statement once; the caller resets it. */
static int step(struct conn *co, int which)
{
	return sqlite3_step(co->st[which]);
}

static void reset(struct conn *co, int which)
{
	sqlite3_reset(co->st[which]);
	sqlite3_clear_bindings(co->st[which]);
}

static int run(ap_cache *c, struct conn *co, int which, const char *what)
{
	int rc = step(co, which);

	reset(co, which);
	return check(c, co, rc, what);
}

enum { STORE, UPKEEP };

/* Whether a write of kind `kind` may run now: 0, or AP_EBUSY (counted in
 * skipped_writes) while the cache is degraded, unless it is a STORE and
 * the retry time has come: then it is the retry (one at a time), after a
 * passive checkpoint.  UPKEEP writes (marking blobs used, removing a
 * corrupted one, eviction) wait until a store has succeeded. */
static int may_write(ap_cache *c, struct conn *co, int kind)
{
	bool go = false;

	if (!atomic_load(&c->degraded))
		return 0;
	if (kind == STORE) {
		int64_t now = now_ms(c);

		pthread_mutex_lock(&c->mu);
		if (!atomic_load(&c->degraded)) {
			go = true;                              /* it ended meanwhile */
		} else if (now >= c->retry_at_ms) {
			c->retry_at_ms = now + c->backoff_ms;   /* the others wait for this one */
			go = co->retrying = true;
		}
		pthread_mutex_unlock(&c->mu);
	}
	if (!go) {
		atomic_fetch_add(&c->skipped_writes, 1);
		return AP_EBUSY;
	}
	if (co->retrying)
		sqlite3_wal_checkpoint_v2(co->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
	return 0;
}

/* Opens a write transaction of kind STORE or UPKEEP (may_write); clears
 * errno, which check() reads when a write fails. */
static int begin(ap_cache *c, struct conn *co, int kind)
{
	int rc = may_write(c, co, kind);

	if (rc)
		return rc;
	errno = 0;
	return run(c, co, ST_BEGIN, "BEGIN IMMEDIATE");
}

static int commit(ap_cache *c, struct conn *co)
{
	int rc = run(c, co, ST_COMMIT, "COMMIT");

	if (rc) {
		step(co, ST_ROLLBACK);
		reset(co, ST_ROLLBACK);
	} else {
		write_ok(c);
	}
	return rc;
}

static int rollback(struct conn *co, int rc)
{
	step(co, ST_ROLLBACK);
	reset(co, ST_ROLLBACK);
	return rc;
}

/* Looks up a 32-byte digest by key in ST_ACTION_GET / ST_KERNEL_GET.
 * 1 found, 0 not, negative on error. */
static int lookup_digest(ap_cache *c, struct conn *co, int which, const uint8_t key[32],
			 uint8_t digest[32])
{
	sqlite3_stmt *st = co->st[which];
	int rc, found = 0;

	sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW && sqlite3_column_bytes(st, 0) == 32) {
		memcpy(digest, sqlite3_column_blob(st, 0), 32);
		found = 1;
	}
	reset(co, which);
	if (rc != SQLITE_ROW && (rc = check(c, co, rc, "lookup")))
		return rc;
	return found;
}

/* Deletes a blob that failed verification. */
static void remove_blob(ap_cache *c, struct conn *co, const uint8_t digest[32], size_t size)
{
	sqlite3_stmt *st = co->st[ST_BLOB_DEL];
	int rc;

	if (begin(c, co, UPKEEP))
		return;
	sqlite3_bind_blob(st, 1, digest, 32, SQLITE_STATIC);
	rc = sqlite3_step(st);
	reset(co, ST_BLOB_DEL);
	if (check(c, co, rc, "deleting a corrupted blob")) {
		rollback(co, 0);
		return;
	}
	if (sqlite3_changes(co->db) > 0 && !commit(c, co)) {
		atomic_fetch_sub(&c->blobs, 1);
		atomic_fetch_sub(&c->blob_bytes, size);
		return;
	}
	rollback(co, 0);
}

/* Marks `digest`'s row used now (its own transaction; a lost lock race
 * only skips it). */
static void touch(ap_cache *c, struct conn *co, const uint8_t digest[32], int64_t now)
{
	sqlite3_stmt *st = co->st[ST_BLOB_TOUCH];
	int rc;

	if (begin(c, co, UPKEEP))
		return;
	sqlite3_bind_blob(st, 1, digest, 32, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, now);
	rc = sqlite3_step(st);
	reset(co, ST_BLOB_TOUCH);
	if (check(c, co, rc, "marking a blob used") || commit(c, co))
		rollback(co, 0);
	ap_hot_touched(c->hot, digest, now);
}

/* Reads and verifies a blob from the file on `co` (then kept in the memory
 * tier): 1 with *out a reference (the caller's), 0 miss or out of memory.
 * The bytes are copied once, from SQLite's row into the blob. */
static int blob_read(ap_cache *c, struct conn *co, const uint8_t digest[32], ap_blob **out)
{
	sqlite3_stmt *st = co->st[ST_BLOB_GET];
	int64_t now = now_s(c), used = 0;
	uint8_t actual[32];
	ap_blob *b = NULL;
	size_t n = 0;
	int rc;

	sqlite3_bind_blob(st, 1, digest, 32, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		n = (size_t)sqlite3_column_bytes(st, 0);
		used = sqlite3_column_int64(st, 1);
		b = ap_blob_new(sqlite3_column_blob(st, 0), n, digest);
	}
	reset(co, ST_BLOB_GET);
	if (rc != SQLITE_ROW) {
		check(c, co, rc, "reading a blob");
		return 0;
	}
	if (!b)
		return 0;
	ap_sha256(ap_blob_data(b), n, actual);
	if (memcmp(actual, digest, 32)) {
		char hex[65];
		ap_hex(digest, 32, hex);
		ap_log(AP_LOG_WARN, "cache %s: blob %s does not match its digest; removed", c->path,
		       hex);
		ap_blob_release(b);
		remove_blob(c, co, digest, n);
		return 0;
	}
	if (now - used >= TOUCH_S) {
		touch(c, co, digest, now);
		used = now;
	}
	ap_hot_put(c->hot, b, used);
	*out = b;
	return 1;
}

/* A verified blob by reference: from the memory tier (marking the file's
 * row used when it is due, on a connection taken only then), else from the
 * file.  `co` may be NULL (one is acquired when needed).  1 with *out, 0
 * miss. */
static int blob_ref(ap_cache *c, struct conn *co, const uint8_t digest[32], ap_blob **out)
{
	int64_t used = 0, now;
	int found;

	if (ap_hot_ref(c->hot, digest, out, &used)) {
		now = now_s(c);
		if (now - used >= TOUCH_S) {
			struct conn *mine = co ? NULL : acquire(c);

			if (co || mine)
				touch(c, co ? co : mine, digest, now);
			release(c, mine);
		}
		return 1;
	}
	if (co)
		return blob_read(c, co, digest, out);
	if (!(co = acquire(c)))
		return 0;
	found = blob_read(c, co, digest, out);
	release(c, co);
	return found;
}

/* Reads and verifies a blob (blob_ref) and copies it out: 1 found (and
 * *data malloc'd, *len set), 0 miss or out of memory. */
static int blob_get(ap_cache *c, struct conn *co, const uint8_t digest[32], uint8_t **data,
		    size_t *len)
{
	ap_blob *b = NULL;
	uint8_t *copy;
	size_t n;

	if (!blob_ref(c, co, digest, &b))
		return 0;
	n = ap_blob_len(b);
	copy = malloc(n ? n : 1);
	if (copy)
		memcpy(copy, ap_blob_data(b), n);
	ap_blob_release(b);
	if (!copy)
		return 0;
	*data = copy;
	*len = n;
	return 1;
}

/* Inserts a blob inside an open transaction (a blob already there is only
 * marked used); 0 or negative. */
static int blob_insert(ap_cache *c, struct conn *co, const uint8_t digest[32],
		       const uint8_t *data, size_t len)
{
	sqlite3_stmt *st = co->st[ST_BLOB_PUT];
	int64_t now = now_s(c);
	int rc;

	sqlite3_bind_blob(st, 1, digest, 32, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, (sqlite3_int64)len);
	sqlite3_bind_blob64(st, 3, data ? (const void *)data : (const void *)"", len, SQLITE_STATIC);
	sqlite3_bind_int64(st, 4, now);
	rc = sqlite3_step(st);
	reset(co, ST_BLOB_PUT);
	if ((rc = check(c, co, rc, "storing a blob")))
		return rc;
	if (sqlite3_changes(co->db) > 0) {
		atomic_fetch_add(&c->blobs, 1);
		atomic_fetch_add(&c->blob_bytes, len);
		return 0;
	}
	st = co->st[ST_BLOB_TOUCH];
	sqlite3_bind_blob(st, 1, digest, 32, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, now);
	rc = sqlite3_step(st);
	reset(co, ST_BLOB_TOUCH);
	return check(c, co, rc, "marking a blob used");
}

/* Points `key` at `digest` in the actions or kernels table, inside an open
 * transaction. */
static int key_insert(ap_cache *c, struct conn *co, int get, int put, const uint8_t key[32],
		      const uint8_t digest[32], atomic_uint_fast64_t *counter)
{
	sqlite3_stmt *st = co->st[put];
	uint8_t old[32];
	int rc, existed;

	existed = lookup_digest(c, co, get, key, old);
	if (existed < 0)
		return existed;
	sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
	sqlite3_bind_blob(st, 2, digest, 32, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, (sqlite3_int64)time(NULL));
	rc = sqlite3_step(st);
	reset(co, put);
	if ((rc = check(c, co, rc, "storing a key")))
		return rc;
	if (!existed)
		atomic_fetch_add(counter, 1);
	return 0;
}

/* ---- the size limit ------------------------------------------------------- */

/* Runs `which` with `digest` bound to ?1 and returns the rows it changed
 * (negative on error). */
static int64_t delete_by_digest(ap_cache *c, struct conn *co, int which, const uint8_t digest[32])
{
	int rc;

	sqlite3_bind_blob(co->st[which], 1, digest, 32, SQLITE_TRANSIENT);
	rc = sqlite3_step(co->st[which]);
	reset(co, which);
	if ((rc = check(c, co, rc, "evicting")))
		return rc;
	return sqlite3_changes(co->db);
}

/* Reads the file's real blob count and bytes (other daemons write it too)
 * into the counters; 0 or negative. */
static int recount(ap_cache *c, struct conn *co, uint64_t *bytes)
{
	sqlite3_stmt *st = co->st[ST_TOTAL];
	int rc = sqlite3_step(st);

	if (rc == SQLITE_ROW) {
		atomic_store(&c->blobs, (uint64_t)sqlite3_column_int64(st, 0));
		*bytes = (uint64_t)sqlite3_column_int64(st, 1);
		atomic_store(&c->blob_bytes, *bytes);
	}
	reset(co, ST_TOTAL);
	return rc == SQLITE_ROW ? 0 : check(c, co, rc, "counting blobs");
}

/* Deletes least recently used blobs, and the rows naming them, until the
 * blobs take at most 90% of max_bytes; one transaction.  0 or negative. */
static int evict(ap_cache *c, struct conn *co, uint64_t max)
{
	uint64_t bytes = 0, low = max - max / 10, n_blobs = 0, n_bytes = 0;
	int64_t actions = 0, kernels = 0;
	int rc = begin(c, co, UPKEEP);

	if (rc)
		return rc;
	if ((rc = recount(c, co, &bytes)))
		return rollback(co, rc);
	while (bytes > low && !rc) {
		uint8_t digests[EVICT_BATCH][32];
		int64_t sizes[EVICT_BATCH];
		int n = 0;
		sqlite3_stmt *st = co->st[ST_LRU];

		while (n < EVICT_BATCH && (rc = sqlite3_step(st)) == SQLITE_ROW) {
			if (sqlite3_column_bytes(st, 0) != 32)
				continue;
			memcpy(digests[n], sqlite3_column_blob(st, 0), 32);
			sizes[n++] = sqlite3_column_int64(st, 1);
		}
		reset(co, ST_LRU);
		rc = rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : check(c, co, rc, "listing blobs");
		if (rc || n == 0)
			break;
		for (int i = 0; i < n && bytes > low && !rc; i++) {
			int64_t a = delete_by_digest(c, co, ST_ACTION_DEL_DIGEST, digests[i]);
			int64_t k = a < 0 ? a : delete_by_digest(c, co, ST_KERNEL_DEL_DIGEST, digests[i]);
			int64_t b = k < 0 ? k : delete_by_digest(c, co, ST_BLOB_DEL, digests[i]);

			if (a < 0 || k < 0 || b < 0) {
				rc = (int)(b < 0 ? b : k < 0 ? k : a);
				break;
			}
			actions += a;
			kernels += k;
			n_blobs += (uint64_t)b;
			n_bytes += b ? (uint64_t)sizes[i] : 0;
			bytes -= b && (uint64_t)sizes[i] <= bytes ? (uint64_t)sizes[i] : 0;
		}
	}
	if (rc || (rc = commit(c, co)))
		return rollback(co, rc);
	atomic_fetch_sub(&c->actions, (uint64_t)actions <= atomic_load(&c->actions) ?
				      (uint64_t)actions : atomic_load(&c->actions));
	atomic_fetch_sub(&c->kernels, (uint64_t)kernels <= atomic_load(&c->kernels) ?
				      (uint64_t)kernels : atomic_load(&c->kernels));
	atomic_fetch_sub(&c->blobs, n_blobs <= atomic_load(&c->blobs) ? n_blobs
								    : atomic_load(&c->blobs));
	atomic_store(&c->blob_bytes, bytes);
	atomic_fetch_add(&c->evicted_blobs, n_blobs);
	atomic_fetch_add(&c->evicted_bytes, n_bytes);
	if (n_blobs) {
		ap_log(AP_LOG_INFO, "cache %s: evicted %llu blobs (%llu bytes) to stay under %llu "
		       "bytes", c->path, (unsigned long long)n_blobs, (unsigned long long)n_bytes,
		       (unsigned long long)max);
		exec_simple(co, "PRAGMA incremental_vacuum", NULL);
	}
	return 0;
}

/* After a write: evicts when the blobs are over the limit. */
static void maybe_evict(ap_cache *c, struct conn *co)
{
	uint64_t max = atomic_load(&c->max_bytes);

	if (max && atomic_load(&c->blob_bytes) > max)
		evict(c, co, max);
}

/* ---- the public functions ------------------------------------------------- */

int ap_cache_blob_get(ap_cache *c, const uint8_t digest[32], uint8_t **data, size_t *len)
{
	if (!ap_cache_enabled(c))
		return 0;
	return blob_get(c, NULL, digest, data, len);
}

int ap_cache_blob_ref(ap_cache *c, const uint8_t digest[32], ap_blob **out)
{
	if (!ap_cache_enabled(c))
		return 0;
	return blob_ref(c, NULL, digest, out);
}

/* Stores a blob whose digest is known; 0 or negative. */
static int blob_put(ap_cache *c, const uint8_t *data, size_t len, const uint8_t d[32])
{
	struct conn *co = acquire(c);
	int rc;

	if (!co)
		return AP_EIO;
	rc = begin(c, co, STORE);
	if (!rc) {
		rc = blob_insert(c, co, d, data, len);
		rc = rc ? rollback(co, rc) : commit(c, co);
	}
	if (!rc)
		maybe_evict(c, co);
	release(c, co);
	return rc;
}

int ap_cache_blob_put(ap_cache *c, const uint8_t *data, size_t len, uint8_t digest[32])
{
	uint8_t d[32];

	ap_sha256(data, len, d);
	if (digest)
		memcpy(digest, d, 32);
	return blob_put(c, data, len, d);
}

int ap_cache_blob_put_known(ap_cache *c, const uint8_t *data, size_t len,
			    const uint8_t digest[32])
{
	return blob_put(c, data, len, digest);
}

/* Shared by ap_cache_get / ap_cache_kernel_get. */
static int get_by_key(ap_cache *c, int which, const uint8_t key[32], uint8_t **val, size_t *len,
		      uint8_t *digest_out)
{
	struct conn *co = acquire(c);
	uint8_t digest[32];
	int found;

	if (!co)
		return 0;
	found = lookup_digest(c, co, which, key, digest);
	if (found == 1)
		found = blob_get(c, co, digest, val, len);
	release(c, co);
	if (found == 1 && digest_out)
		memcpy(digest_out, digest, 32);
	return found == 1;
}

/* Stores `val` (whose SHA-256 is `digest`) and points `key` at it. */
static int put_by_key(ap_cache *c, int get, int put, atomic_uint_fast64_t *counter,
		      const uint8_t key[32], const uint8_t *val, size_t len,
		      const uint8_t digest[32])
{
	struct conn *co = acquire(c);
	int rc;

	if (!co)
		return AP_EIO;
	rc = begin(c, co, STORE);
	if (!rc) {
		rc = blob_insert(c, co, digest, val, len);
		if (!rc)
			rc = key_insert(c, co, get, put, key, digest, counter);
		rc = rc ? rollback(co, rc) : commit(c, co);
	}
	if (!rc)
		maybe_evict(c, co);
	release(c, co);
	return rc;
}

int ap_cache_get(ap_cache *c, const uint8_t key[32], uint8_t **val, size_t *len)
{
	return get_by_key(c, ST_ACTION_GET, key, val, len, NULL);
}

int ap_cache_get_ref(ap_cache *c, const uint8_t key[32], ap_blob **out)
{
	struct conn *co = acquire(c);
	uint8_t digest[32];
	int found;

	if (!co)
		return 0;
	found = lookup_digest(c, co, ST_ACTION_GET, key, digest);
	if (found == 1)
		found = blob_ref(c, co, digest, out);
	release(c, co);
	return found == 1;
}

int ap_cache_put(ap_cache *c, const uint8_t key[32], const uint8_t *val, size_t len)
{
	uint8_t digest[32];

	ap_sha256(val, len, digest);
	return put_by_key(c, ST_ACTION_GET, ST_ACTION_PUT, &c->actions, key, val, len, digest);
}

int ap_cache_kernel_get(ap_cache *c, const uint8_t key[32], uint8_t **data, size_t *len,
			uint8_t digest[32])
{
	return get_by_key(c, ST_KERNEL_GET, key, data, len, digest);
}

int ap_cache_kernel_put(ap_cache *c, const uint8_t key[32], const uint8_t *data, size_t len,
			uint8_t digest[32])
{
	uint8_t d[32];

	ap_sha256(data, len, d);
	if (digest)
		memcpy(digest, d, 32);
	return put_by_key(c, ST_KERNEL_GET, ST_KERNEL_PUT, &c->kernels, key, data, len, d);
}

int ap_cache_kernel_put_known(ap_cache *c, const uint8_t key[32], const uint8_t *data,
			      size_t len, const uint8_t digest[32])
{
	return put_by_key(c, ST_KERNEL_GET, ST_KERNEL_PUT, &c->kernels, key, data, len, digest);
}

/* ---- tuning records ------------------------------------------------------------ */

static void text_col(sqlite3_stmt *st, int i, char *buf, size_t cap)
{
	const unsigned char *v = sqlite3_column_text(st, i);

	snprintf(buf, cap, "%s", v ? (const char *)v : "");
}

int ap_cache_tuning_get(ap_cache *c, const uint8_t sig[32], const char *target,
			const char *device, ap_tune_record *out)
{
	struct conn *co = acquire(c);
	int which = device ? ST_TUNE_GET_DEV : ST_TUNE_GET_ANY, rc, found = 0;
	sqlite3_stmt *st;

	memset(out, 0, sizeof(*out));
	if (!co)
		return 0;
	st = co->st[which];
	sqlite3_bind_blob(st, 1, sig, 32, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, target, -1, SQLITE_STATIC);
	if (device)
		sqlite3_bind_text(st, 3, device, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		text_col(st, 0, out->device, sizeof(out->device));
		out->sms = (unsigned)sqlite3_column_int64(st, 1);
		text_col(st, 2, out->emitter, sizeof(out->emitter));
		text_col(st, 3, out->config, sizeof(out->config));
		out->modelled_us = sqlite3_column_double(st, 4);
		out->measured_us = sqlite3_column_type(st, 5) == SQLITE_NULL ? -1 : sqlite3_column_double(st, 5);
		text_col(st, 6, out->method, sizeof(out->method));
		out->tried = (unsigned)sqlite3_column_int64(st, 7);
		text_col(st, 8, out->candidates, sizeof(out->candidates));
		found = 1;
	}
	reset(co, which);
	if (rc != SQLITE_ROW && (rc = check(c, co, rc, "tuning lookup")))
		found = rc;
	release(c, co);
	return found;
}

/* Runs `sql` on `co` with ?1 a 32-byte blob, ?2 and ?3 text (either may
 * be NULL: bound as NULL); rows are stepped through and dropped.  0 or a
 * negative code (check()). */
static int exec_sig(ap_cache *c, struct conn *co, const char *sql, const uint8_t sig[32],
		    const char *a, const char *b, const char *what)
{
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(co->db, sql, -1, &st, NULL);

	if (rc == SQLITE_OK) {
		if (sig)
			sqlite3_bind_blob(st, 1, sig, 32, SQLITE_STATIC);
		if (a)
			sqlite3_bind_text(st, 2, a, -1, SQLITE_STATIC);
		if (b)
			sqlite3_bind_text(st, 3, b, -1, SQLITE_STATIC);
		while ((rc = sqlite3_step(st)) == SQLITE_ROW)
			;
	}
	sqlite3_finalize(st);
	return check(c, co, rc == SQLITE_DONE ? SQLITE_OK : rc, what);
}

/* Deletes the cached bundles (action rows) that hold kernel `sig` built
 * for `target` on `device` (NULL: any device), inside an open
 * transaction.  0 or negative. */
static int retire(ap_cache *c, struct conn *co, const uint8_t sig[32], const char *target,
		  const char *device)
{
	static const char del_actions[] =
		"DELETE FROM actions WHERE key IN (SELECT key FROM bundle_tuned WHERE sig = ?1"
		" AND target = ?2 AND (?3 IS NULL OR device = ?3))";
	static const char del_rows[] =
		"DELETE FROM bundle_tuned WHERE sig = ?1 AND target = ?2 AND (?3 IS NULL OR device = ?3)";
	int rc = exec_sig(c, co, del_actions, sig, target, device, "retiring bundles");
	uint64_t gone = rc ? 0 : (uint64_t)sqlite3_changes(co->db), had = atomic_load(&c->actions);

	if (!rc)
		rc = exec_sig(c, co, del_rows, sig, target, device, "retiring bundles");
	if (!rc && gone) {
		atomic_store(&c->actions, gone <= had ? had - gone : 0);
		atomic_fetch_add(&c->retired, gone);
	}
	return rc;
}

/* Keeps at most `max` rows of `table` matching `where`, deleting the
 * oldest (by `created`) beyond it.  0 or negative. */
static int bound_rows(ap_cache *c, struct conn *co, const char *table, const char *where,
		      int64_t max)
{
	char sql[400];

	snprintf(sql, sizeof(sql),
		 "DELETE FROM %s WHERE rowid IN (SELECT rowid FROM %s WHERE %s ORDER BY created"
		 " DESC LIMIT -1 OFFSET %lld)", table, table, where, (long long)max);
	return exec_sig(c, co, sql, NULL, NULL, NULL, "bounding a table");
}

/* Runs `sql` once per row i < n in one transaction on a pooled
 * connection, bind(st, i, user) binding row i; then, when `table` is not
 * NULL, keeps at most `max` of its rows (bound_rows).  All or nothing.
 * 0, or negative (off, busy, I/O). */
static int insert_rows(ap_cache *c, const char *sql, int n,
		       void (*bind)(sqlite3_stmt *st, int i, const void *user), const void *user,
		       const char *what, const char *table, int64_t max)
{
	struct conn *co;
	sqlite3_stmt *st = NULL;
	int rc;

	if (!(co = acquire(c)))
		return AP_EIO;
	rc = begin(c, co, STORE);
	if (!rc) {
		int s = sqlite3_prepare_v2(co->db, sql, -1, &st, NULL);

		for (int i = 0; s == SQLITE_OK && i < n; i++) {
			bind(st, i, user);
			s = sqlite3_step(st);
			s = s == SQLITE_DONE ? SQLITE_OK : s;
			sqlite3_reset(st);
		}
		sqlite3_finalize(st);
		rc = check(c, co, s, what);
		if (!rc && table)
			rc = bound_rows(c, co, table, "1", max);
		rc = rc ? rollback(co, rc) : commit(c, co);
	}
	release(c, co);
	return rc;
}

struct tuned_rows {
	const uint8_t *key;
	const char *target, *device;
	const uint8_t (*sigs)[32];
};

static void bind_tuned(sqlite3_stmt *st, int i, const void *user)
{
	const struct tuned_rows *t = user;

	sqlite3_bind_blob(st, 1, t->key, 32, SQLITE_STATIC);
	sqlite3_bind_blob(st, 2, t->sigs[i], 32, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, t->target, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 4, t->device ? t->device : "", -1, SQLITE_STATIC);
}

int ap_cache_bundle_tuned(ap_cache *c, const uint8_t key[32], const char *target,
			  const char *device, const uint8_t (*sigs)[32], int n)
{
	struct tuned_rows t = { key, target, device, sigs };

	if (n <= 0)
		return 0;
	return insert_rows(c, "INSERT OR IGNORE INTO bundle_tuned(key, sig, target, device)"
			   " VALUES (?1, ?2, ?3, ?4)", n, bind_tuned, &t,
			   "noting a bundle's tuned kernels", NULL, 0);
}

struct report_rows {
	const char *target, *device, *reporter;
	const ap_cache_report *rows;
	int64_t now;
};

static void bind_report(sqlite3_stmt *st, int i, const void *user)
{
	const struct report_rows *r = user;

	sqlite3_bind_blob(st, 1, r->rows[i].sig, 32, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, r->target, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, r->device, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 4, r->reporter, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 5, r->rows[i].schedule, -1, SQLITE_STATIC);
	sqlite3_bind_double(st, 6, r->rows[i].time_us);
	sqlite3_bind_int64(st, 7, r->now);
}

int ap_cache_report_put(ap_cache *c, const char *target, const char *device, const char *reporter,
			const ap_cache_report *rows, int n)
{
	struct report_rows r = { target, device, reporter, rows, now_s(c) };

	return insert_rows(c, "INSERT OR REPLACE INTO tune_reports(sig, target, device, reporter,"
			   " schedule, time_us, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)", n,
			   bind_report, &r, "storing a tuning report", "tune_reports",
			   AP_CACHE_REPORTS_MAX);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int ap_cache_report_agreed(ap_cache *c, const uint8_t sig[32], const char *target,
			   const char *device, const char *trusted, char *schedule, size_t cap,
			   double *median_us, unsigned *reporters)
{
	static const char sql[] = "SELECT schedule, reporter, time_us FROM tune_reports WHERE"
				  " sig = ?1 AND target = ?2 AND device = ?3 ORDER BY schedule LIMIT 4096";
	struct conn *co = acquire(c);
	sqlite3_stmt *st = NULL;
	char cur[256] = "";
	double *t = NULL, best = 0;
	unsigned n = 0, best_n = 0;
	bool cur_trusted = false, found = false;
	int rc;

	if (!co)
		return 0;
	t = malloc(4096 * sizeof(*t));
	rc = t ? sqlite3_prepare_v2(co->db, sql, -1, &st, NULL) : SQLITE_NOMEM;
	if (rc == SQLITE_OK) {
		sqlite3_bind_blob(st, 1, sig, 32, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, target, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, device, -1, SQLITE_STATIC);
	}
	/* rows by schedule; each schedule's group closes when the next starts
	 * (and after the last row: one extra turn with rc != ROW) */
	for (bool more = rc == SQLITE_OK; more;) {
		const char *sch = NULL, *who = NULL;

		rc = sqlite3_step(st);
		if (rc == SQLITE_ROW) {
			sch = (const char *)sqlite3_column_text(st, 0);
			who = (const char *)sqlite3_column_text(st, 1);
		}
		if (!sch || strcmp(sch, cur)) {
			if (n >= 2 || (n >= 1 && cur_trusted)) {
				double m;

				qsort(t, n, sizeof(*t), cmp_double);
				m = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
				if (!found || m < best) {
					found = true;
					best = m;
					best_n = n;
					snprintf(schedule, cap, "%s", cur);
				}
			}
			n = 0;
			cur_trusted = false;
			snprintf(cur, sizeof(cur), "%s", sch ? sch : "");
		}
		if (!sch) {
			more = false;
			continue;
		}
		t[n++] = sqlite3_column_double(st, 2);
		cur_trusted |= trusted && who && !strcmp(who, trusted);
	}
	sqlite3_finalize(st);
	free(t);
	rc = check(c, co, rc == SQLITE_DONE || rc == SQLITE_OK ? SQLITE_OK : rc, "reading reports");
	release(c, co);
	if (rc)
		return rc;
	if (found) {
		*median_us = best;
		*reporters = best_n;
	}
	return found;
}

int ap_cache_tuning_put_many(ap_cache *c, const uint8_t (*sigs)[32], const char *target,
			     const ap_tune_record *recs, int n, bool advance)
{
	struct conn *co = acquire(c);
	sqlite3_stmt *st;
	bool any_measured = false;
	int rc;

	if (!co)
		return AP_EIO;
	rc = begin(c, co, STORE);
	if (!rc) {
		for (int i = 0; !rc && i < n; i++) {
			const ap_tune_record *r = &recs[i];
			bool measured = r->measured_us >= 0;

			any_measured |= measured;
			st = co->st[ST_TUNE_PUT];
			sqlite3_bind_blob(st, 1, sigs[i], 32, SQLITE_STATIC);
			sqlite3_bind_text(st, 2, target, -1, SQLITE_STATIC);
			sqlite3_bind_text(st, 3, measured ? r->device : "", -1, SQLITE_STATIC);
			sqlite3_bind_int64(st, 4, measured ? r->sms : 0);
			sqlite3_bind_text(st, 5, r->emitter, -1, SQLITE_STATIC);
			sqlite3_bind_text(st, 6, r->config, -1, SQLITE_STATIC);
			sqlite3_bind_double(st, 7, r->modelled_us);
			if (measured)
				sqlite3_bind_double(st, 8, r->measured_us);
			else
				sqlite3_bind_null(st, 8);
			sqlite3_bind_text(st, 9, r->method, -1, SQLITE_STATIC);
			sqlite3_bind_int64(st, 10, r->tried);
			sqlite3_bind_text(st, 11, r->candidates, -1, SQLITE_STATIC);
			sqlite3_bind_int64(st, 12, now_s(c));
			rc = run(c, co, ST_TUNE_PUT, "tuning insert");
		}
		/* a measurement (or the background tuner's new choice) changes
		 * what compiles produce: the bundles holding those kernels retire,
		 * for the record's device (a model record: for every device) */
		for (int i = 0; !rc && (any_measured || advance) && i < n; i++)
			rc = retire(c, co, sigs[i], target,
				    recs[i].measured_us >= 0 ? recs[i].device : NULL);
		if (!rc && any_measured)
			rc = bound_rows(c, co, "tuning", "measured_us IS NOT NULL",
					AP_CACHE_MEASURED_MAX);
		if (!rc && (any_measured || advance))
			rc = run(c, co, ST_TUNE_BUMP, "tuning generation");
		rc = rc ? rollback(co, rc) : commit(c, co);
	}
	if (!rc)
		count_tuning(c, co);
	release(c, co);
	return rc;
}

int ap_cache_tuning_put(ap_cache *c, const uint8_t sig[32], const char *target,
			const ap_tune_record *r)
{
	return ap_cache_tuning_put_many(c, (const uint8_t (*)[32])sig, target, r, 1, false);
}

uint64_t ap_cache_tuning_generation(ap_cache *c)
{
	struct conn *co = acquire(c);
	sqlite3_stmt *st;
	uint64_t gen = 0;
	int rc;

	if (!co)
		return 0;
	st = co->st[ST_TUNE_GEN];
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		gen = (uint64_t)strtoull((const char *)sqlite3_column_text(st, 0), NULL, 10);
	reset(co, ST_TUNE_GEN);
	if (rc != SQLITE_ROW)
		check(c, co, rc, "tuning generation");
	release(c, co);
	return gen;
}

void ap_cache_set_limits(ap_cache *c, uint64_t max_bytes, uint64_t memory_bytes)
{
	struct conn *co;

	if (!c)
		return;
	atomic_store(&c->max_bytes, max_bytes);
	if (!c->hot && memory_bytes)
		c->hot = ap_hot_new(memory_bytes);
	co = acquire(c);
	if (co) {
		maybe_evict(c, co);
		release(c, co);
	}
}

void ap__cache_set_time(ap_cache *c, int64_t now)
{
	atomic_store(&c->fake_now, now);
}

int ap__cache_blob_overwrite(ap_cache *c, const uint8_t digest[32], const uint8_t *data,
			     size_t len)
{
	struct conn *co = acquire(c);
	sqlite3_stmt *st;
	int rc;

	if (!co)
		return AP_EIO;
	st = co->st[ST_BLOB_SET];
	sqlite3_bind_blob(st, 1, digest, 32, SQLITE_STATIC);
	sqlite3_bind_blob64(st, 2, data, len, SQLITE_STATIC);
	rc = sqlite3_step(st);
	reset(co, ST_BLOB_SET);
	rc = check(c, co, rc, "overwriting a blob");
	release(c, co);
	return rc;
}
