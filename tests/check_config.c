/* check_config.c -- apollod's configuration table, file parser, flags and
 * the committed deploy/apollod.conf (server/config.c). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/trust.h"
#include "server/config.h"

START_TEST(table_is_consistent)
{
	int n = 0;
	const ap_config_option *t = ap_config_table(&n);
	ap_config cfg;
	ap_error err;

	ck_assert_int_ge(n, 10);
	for (int i = 0; i < n; i++) {
		/* Every default parses, and every name finds itself both ways. */
		char dashed[64];
		ck_assert_msg(t[i].help && strlen(t[i].help) > 10, "%s has no help", t[i].name);
		ck_assert_int_eq(ap_config_set(&cfg, t[i].name, t[i].dflt, &err), 0);
		ck_assert_ptr_eq(ap_config_find(t[i].name), &t[i]);
		snprintf(dashed, sizeof(dashed), "%s", t[i].name);
		for (char *p = dashed; *p; p++)
			if (*p == '_')
				*p = '-';
		ck_assert_ptr_eq(ap_config_find(dashed), &t[i]);
		for (int j = 0; j < i; j++)
			ck_assert_str_ne(t[i].name, t[j].name);
	}
	ck_assert_ptr_null(ap_config_find("no_such_option"));
}
END_TEST

START_TEST(defaults)
{
	ap_config cfg;

	ap_config_defaults(&cfg);
	ck_assert_str_eq(cfg.socket, "");
	ck_assert_str_eq(cfg.tcp, "");
	ck_assert_str_eq(cfg.cache, "");
	ck_assert_int_eq(cfg.max_frame_bytes, 64LL << 20);
	ck_assert_int_eq(cfg.socket_mode, 0600);
	ck_assert_int_eq(cfg.workers, 0);
	ck_assert_int_eq(cfg.max_clients, 256);
	ck_assert_int_eq(cfg.log_level, AP_LOG_INFO);
	ck_assert_int_eq(cfg.foreground, 1);
}
END_TEST

/* One value per row: the text, whether it is accepted, and the result. */
START_TEST(values)
{
	static const struct {
		const char *key, *value;
		int rc;
		long long want;
	} rows[] = {
		{ "max_frame_bytes", "1M", 0, 1LL << 20 },
		{ "max_frame_bytes", "2048", 0, 2048 },
		{ "max_frame_bytes", "16MiB", 0, 16LL << 20 },
		{ "max_frame_bytes", "1g", 0, 1LL << 30 },
		{ "max_frame_bytes", "2G", AP_EINVAL, 0 },      /* over the limit */
		{ "max_frame_bytes", "100", AP_EINVAL, 0 },     /* under it */
		{ "max_frame_bytes", "12X", AP_EINVAL, 0 },
		{ "max_frame_bytes", "", AP_EINVAL, 0 },
		{ "workers", "8", 0, 8 },
		{ "workers", "0x10", 0, 16 },
		{ "workers", "-1", AP_EINVAL, 0 },
		{ "workers", "257", AP_EINVAL, 0 },
		{ "workers", "eight", AP_EINVAL, 0 },
		{ "workers", "99999999999999999999999", AP_EINVAL, 0 },
		{ "socket_mode", "0660", 0, 0660 },
		{ "socket_mode", "01777", AP_EINVAL, 0 },
		{ "log_level", "debug", 0, AP_LOG_DEBUG },
		{ "log_level", "WARN", 0, AP_LOG_WARN },
		{ "log_level", "loud", AP_EINVAL, 0 },
		{ "foreground", "no", 0, 0 },
		{ "foreground", "on", 0, 1 },
		{ "foreground", "maybe", AP_EINVAL, 0 },
		{ "max-clients", "3", 0, 3 },
		{ "nonsense", "1", AP_EINVAL, 0 },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		ap_config cfg;
		ap_error err;
		int rc;
		long long got = -1;

		ap_config_defaults(&cfg);
		rc = ap_config_set(&cfg, rows[i].key, rows[i].value, &err);
		ck_assert_msg(rc == rows[i].rc, "%s = '%s': rc %d, want %d (%s)", rows[i].key,
			      rows[i].value, rc, rows[i].rc, rc ? err.msg : "");
		if (rc) {
			ck_assert_msg(strlen(err.msg) > 0, "no message for %s", rows[i].key);
			continue;
		}
		if (!strcmp(rows[i].key, "max_frame_bytes"))
			got = cfg.max_frame_bytes;
		else if (!strcmp(rows[i].key, "workers"))
			got = cfg.workers;
		else if (!strcmp(rows[i].key, "socket_mode"))
			got = cfg.socket_mode;
		else if (!strcmp(rows[i].key, "log_level"))
			got = cfg.log_level;
		else if (!strcmp(rows[i].key, "foreground"))
			got = cfg.foreground;
		else if (!strcmp(rows[i].key, "max-clients"))
			got = cfg.max_clients;
		ck_assert_msg(got == rows[i].want, "%s = '%s' gave %lld, want %lld", rows[i].key,
			      rows[i].value, got, rows[i].want);
	}
}
END_TEST

START_TEST(strings)
{
	ap_config cfg;
	ap_error err;
	char longval[2000];

	ap_config_defaults(&cfg);
	ck_assert_int_eq(ap_config_set(&cfg, "socket", "\"/tmp/a b.sock\"", &err), 0);
	ck_assert_str_eq(cfg.socket, "/tmp/a b.sock");
	memset(longval, 'x', sizeof(longval) - 1);
	longval[sizeof(longval) - 1] = '\0';
	ck_assert_int_eq(ap_config_set(&cfg, "socket", longval, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "at most 107"));
}
END_TEST

START_TEST(file_text)
{
	ap_config cfg;
	ap_error err;
	const char *good =
		"# a comment\n"
		"\n"
		"   socket = /tmp/apollo-test.sock   # trailing comment\n"
		"workers=3\n"
		"max_frame_bytes = 8M\r\n"
		"tcp = \"127.0.0.1:7070\"\n"
		"tcp_token = \"a#b\"\n"
		"log_level = debug";

	ap_config_defaults(&cfg);
	ck_assert_int_eq(ap_config_parse_text(&cfg, good, "t.conf", &err), 0);
	ck_assert_str_eq(cfg.socket, "/tmp/apollo-test.sock");
	ck_assert_int_eq(cfg.workers, 3);
	ck_assert_int_eq(cfg.max_frame_bytes, 8LL << 20);
	ck_assert_str_eq(cfg.tcp, "127.0.0.1:7070");
	ck_assert_str_eq(cfg.tcp_token, "a#b");
	ck_assert_int_eq(cfg.log_level, AP_LOG_DEBUG);
}
END_TEST

/* Each bad file names its line. */
START_TEST(file_errors)
{
	static const struct {
		const char *text, *want;
	} rows[] = {
		{ "workers = 2\nno equals sign here\n", "t.conf:2: expected `key = value`" },
		{ "\n\n\ncolour = blue\n", "t.conf:4: unknown setting 'colour'" },
		{ "# c\nworkers = 1000\n", "t.conf:2: workers: 1000 is out of range 0..256" },
		{ " = 3\n", "t.conf:1: missing key" },
		{ "log_level = info\nforeground = perhaps\n", "t.conf:2: foreground" },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		ap_config cfg;
		ap_error err;

		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_text(&cfg, rows[i].text, "t.conf", &err), AP_EINVAL);
		ck_assert_msg(!strncmp(err.msg, rows[i].want, strlen(rows[i].want)),
			      "got '%s', want '%s...'", err.msg, rows[i].want);
	}
}
END_TEST

START_TEST(file_io)
{
	char path[] = "/tmp/apollo-config-XXXXXX";
	int fd = mkstemp(path);
	ap_config cfg;
	ap_error err;
	const char text[] = "max_clients = 7\nbad line\n";

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, sizeof(text) - 1), (int)sizeof(text) - 1);
	close(fd);
	ap_config_defaults(&cfg);
	ck_assert_int_eq(ap_config_parse_file(&cfg, path, &err), AP_EINVAL);
	ck_assert_int_eq(cfg.max_clients, 7);
	ck_assert_ptr_nonnull(strstr(err.msg, ":2: "));
	unlink(path);
	ck_assert_int_eq(ap_config_parse_file(&cfg, path, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, path));
}
END_TEST

START_TEST(command_line)
{
	char path[] = "/tmp/apollo-config-XXXXXX";
	int fd = mkstemp(path);
	const char text[] = "workers = 5\nmax_clients = 9\nsocket = /tmp/from-file.sock\n";
	ap_config cfg;
	ap_config_action action;
	ap_error err;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, sizeof(text) - 1), (int)sizeof(text) - 1);
	close(fd);
	unsetenv("APOLLO_SOCKET");
	{
		/* Flags override the file wherever they stand. */
		char *argv[] = { "apollod", "--workers", "2", "--config", path, "--max-frame-bytes=4M",
				 "--no-foreground", "--log-level", "warn", NULL };
		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 9, argv, &action, &err), 0);
		ck_assert_int_eq(action, AP_CONFIG_RUN);
		ck_assert_int_eq(cfg.workers, 2);
		ck_assert_int_eq(cfg.max_clients, 9);
		ck_assert_str_eq(cfg.socket, "/tmp/from-file.sock");
		ck_assert_int_eq(cfg.max_frame_bytes, 4LL << 20);
		ck_assert_int_eq(cfg.foreground, 0);
		ck_assert_int_eq(cfg.log_level, AP_LOG_WARN);
	}
	{
		/* $APOLLO_SOCKET beats the file, --socket beats both. */
		char *argv1[] = { "apollod", "--config", path, NULL };
		char *argv2[] = { "apollod", "--config", path, "--socket", "/tmp/flag.sock", NULL };
		setenv("APOLLO_SOCKET", "/tmp/env.sock", 1);
		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 3, argv1, &action, &err), 0);
		ck_assert_str_eq(cfg.socket, "/tmp/env.sock");
		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 5, argv2, &action, &err), 0);
		ck_assert_str_eq(cfg.socket, "/tmp/flag.sock");
		unsetenv("APOLLO_SOCKET");
	}
	{
		char *bad1[] = { "apollod", "--wrokers", "2", NULL };
		char *bad2[] = { "apollod", "--workers", NULL };
		char *bad3[] = { "apollod", "stray", NULL };
		char *bad4[] = { "apollod", "--no-workers", NULL };
		char *help[] = { "apollod", "--workers", "2", "--help", NULL };
		char *print[] = { "apollod", "--print-config", NULL };
		ck_assert_int_eq(ap_config_parse_args(&cfg, 3, bad1, &action, &err), AP_EINVAL);
		ck_assert_ptr_nonnull(strstr(err.msg, "--wrokers"));
		ck_assert_int_eq(ap_config_parse_args(&cfg, 2, bad2, &action, &err), AP_EINVAL);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 2, bad3, &action, &err), AP_EINVAL);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 2, bad4, &action, &err), AP_EINVAL);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 4, help, &action, &err), 0);
		ck_assert_int_eq(action, AP_CONFIG_HELP);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 2, print, &action, &err), 0);
		ck_assert_int_eq(action, AP_CONFIG_PRINT);
	}
	unlink(path);
}
END_TEST

static char *read_all(FILE *f, size_t *len)
{
	char *buf = NULL;
	size_t cap = 0, n = 0, r;

	for (;;) {
		if (n + 4096 > cap) {
			cap = (cap ? cap * 2 : 8192);
			buf = realloc(buf, cap + 1);
			ck_assert_ptr_nonnull(buf);
		}
		r = fread(buf + n, 1, cap - n, f);
		n += r;
		if (r == 0)
			break;
	}
	buf[n] = '\0';
	*len = n;
	return buf;
}

/* deploy/apollod.conf is exactly what --print-config writes, and parsing it
 * gives the defaults. */
/* Writes `text` to dir/name with `mode`; the path goes to `path`. */
static void write_file(const char *dir, const char *name, const char *text, mode_t mode,
		       char *path, size_t cap)
{
	FILE *f;

	snprintf(path, cap, "%s/%s", dir, name);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
	ck_assert_int_eq(chmod(path, mode), 0);
}

/* common/trust.h's rule (issue 29, item 1): the file's owner and mode, its
 * directory, the directories above it, secrets, missing files. */
START_TEST(trust_rule)
{
	char dir[] = "/tmp/apollo-trust-XXXXXX", sub[128], path[192], cmd[160];
	ap_error err;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	write_file(dir, "ok", "x\n", 0644, path, sizeof(path));
	ck_assert_int_eq(ap_trust_path(path, "file", 0, &err), 0);
	/* a secret readable by others */
	ck_assert_int_eq(ap_trust_path(path, "token file", AP_TRUST_SECRET, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "readable by others"));
	ck_assert_ptr_nonnull(strstr(err.msg, path));
	ck_assert_int_eq(chmod(path, 0640), 0);
	ck_assert_int_eq(ap_trust_path(path, "token file", AP_TRUST_SECRET, &err), 0);
	/* writable by group or others */
	ck_assert_int_eq(chmod(path, 0664), 0);
	ck_assert_int_eq(ap_trust_path(path, "file", 0, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "writable by its group"));
	ck_assert_int_eq(chmod(path, 0646), 0);
	ck_assert_int_eq(ap_trust_path(path, "file", 0, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "writable by others"));
	ck_assert_int_eq(chmod(path, 0644), 0);
	/* another user's file */
	if (geteuid() == 0) {
		ck_assert_int_eq(chown(path, 65534, 65534), 0);
		ck_assert_int_eq(ap_trust_path(path, "file", 0, &err), AP_EIO);
		ck_assert_ptr_nonnull(strstr(err.msg, "belongs to uid 65534"));
		ck_assert_int_eq(chown(path, 0, 0), 0);
	}
	/* a directory anyone can write: refused unless sticky, and for a
	 * private directory (a database) refused even when sticky */
	snprintf(sub, sizeof(sub), "%s/open", dir);
	ck_assert_int_eq(mkdir(sub, 0700), 0);
	write_file(sub, "f", "x\n", 0600, path, sizeof(path));
	ck_assert_int_eq(chmod(sub, 0777), 0);
	ck_assert_int_eq(ap_trust_path(path, "file", 0, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "not sticky"));
	ck_assert_int_eq(chmod(sub, 01777), 0);
	ck_assert_int_eq(ap_trust_path(path, "file", 0, &err), 0);
	ck_assert_int_eq(ap_trust_path(path, "db", AP_TRUST_PRIVATE_DIR, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, sub));
	/* a file not there yet: its directory decides; a directory further up
	 * that anyone can write without the sticky bit refuses it too */
	snprintf(path, sizeof(path), "%s/missing/deeper/f.db", sub);
	ck_assert_int_eq(ap_trust_path(path, "db", AP_TRUST_MAY_BE_MISSING, &err), 0);
	ck_assert_int_eq(chmod(sub, 0777), 0);
	ck_assert_int_eq(ap_trust_path(path, "db", AP_TRUST_MAY_BE_MISSING, &err), AP_EIO);
	ck_assert_int_eq(ap_trust_path(path, "db", 0, &err), AP_EIO);  /* missing */
	ck_assert_int_eq(chmod(sub, 0700), 0);
	/* a symbolic link is judged by what it points to */
	{
		char link[192];

		snprintf(path, sizeof(path), "%s/f", sub);
		snprintf(link, sizeof(link), "%s/link", dir);
		ck_assert_int_eq(symlink(path, link), 0);
		ck_assert_int_eq(ap_trust_path(link, "file", 0, &err), 0);
		ck_assert_int_eq(chmod(path, 0666), 0);
		ck_assert_int_eq(ap_trust_path(link, "file", 0, &err), AP_EIO);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Issue 29, item 3: tcp_token from a private file; a config file that sets
 * tcp_token must be private; --tcp-token is scrubbed from argv. */
START_TEST(token_sources)
{
	char dir[] = "/tmp/apollo-token-XXXXXX", tok[192], conf[192], cmd[160];
	char token_flag[] = "flag-secret", tok_arg[240];
	ap_config cfg;
	ap_config_action action;
	ap_error err;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	write_file(dir, "token", "from-the-file\n", 0600, tok, sizeof(tok));
	snprintf(tok_arg, sizeof(tok_arg), "--tcp-token-file=%s", tok);
	{
		char *argv[] = { "apollod", tok_arg, NULL };

		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 2, argv, &action, &err), 0);
		ck_assert_str_eq(cfg.tcp_token, "from-the-file");
	}
	ck_assert_int_eq(chmod(tok, 0604), 0);
	{
		char *argv[] = { "apollod", tok_arg, NULL };

		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 2, argv, &action, &err), AP_EIO);
		ck_assert_ptr_nonnull(strstr(err.msg, "readable by others"));
	}
	ck_assert_int_eq(chmod(tok, 0600), 0);
	{
		/* both: ambiguous, refused */
		char *argv[] = { "apollod", tok_arg, "--tcp-token", token_flag, NULL };

		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 4, argv, &action, &err), AP_EINVAL);
	}
	{
		/* the flag: taken, and its text in argv overwritten */
		char flag[] = "flag-secret";
		char *argv[] = { "apollod", "--tcp-token", flag, NULL };

		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 3, argv, &action, &err), 0);
		ck_assert_str_eq(cfg.tcp_token, "flag-secret");
		ck_assert_str_eq(flag, "***********");
	}
	/* a config file that sets the token: private only */
	write_file(dir, "apollod.conf", "tcp_token = in-the-conf\n", 0644, conf, sizeof(conf));
	{
		char *argv[] = { "apollod", "--config", conf, NULL };

		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 3, argv, &action, &err), AP_EIO);
		ck_assert_ptr_nonnull(strstr(err.msg, "tcp_token_file"));
		ck_assert_int_eq(chmod(conf, 0600), 0);
		ap_config_defaults(&cfg);
		ck_assert_int_eq(ap_config_parse_args(&cfg, 3, argv, &action, &err), 0);
		ck_assert_str_eq(cfg.tcp_token, "in-the-conf");
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(committed_conf_matches)
{
	const char *candidates[] = { "deploy/apollod.conf", "../deploy/apollod.conf",
				     "../../deploy/apollod.conf" };
	char *printed, *committed = NULL;
	size_t plen, clen = 0;
	FILE *f = NULL, *mem;
	char *membuf = NULL;
	size_t memlen = 0;
	const char *build = getenv("APOLLO_BUILD");
	char path[4096];
	ap_config a, b;
	ap_error err;

	if (build) {
		snprintf(path, sizeof(path), "%s/../deploy/apollod.conf", build);
		f = fopen(path, "r");
	}
	for (size_t i = 0; !f && i < 3; i++)
		f = fopen(candidates[i], "r");
	ck_assert_msg(f != NULL, "deploy/apollod.conf not found from the current directory");
	committed = read_all(f, &clen);
	fclose(f);

	mem = open_memstream(&membuf, &memlen);
	ap_config_print_defaults(mem);
	fclose(mem);
	printed = membuf;
	plen = memlen;
	ck_assert_msg(plen == clen && !memcmp(printed, committed, plen),
		      "deploy/apollod.conf differs from `apollod --print-config`: regenerate it");

	ap_config_defaults(&a);
	memset(&b, 0x5a, sizeof(b));
	ap_config_defaults(&b);
	ck_assert_int_eq(ap_config_parse_text(&b, committed, "apollod.conf", &err), 0);
	ck_assert_int_eq(memcmp(&a, &b, sizeof(a)), 0);
	free(printed);
	free(committed);
}
END_TEST

START_TEST(usage_lists_every_flag)
{
	int n = 0;
	const ap_config_option *t = ap_config_table(&n);
	char *buf = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&buf, &len);

	ap_config_print_usage(mem, "apollod");
	fclose(mem);
	for (int i = 0; i < n; i++) {
		char flag[80];
		snprintf(flag, sizeof(flag), "--%s", t[i].name);
		for (char *p = flag; *p; p++)
			if (*p == '_')
				*p = '-';
		ck_assert_msg(strstr(buf, flag), "--help lacks %s", flag);
	}
	free(buf);
}
END_TEST

static Suite *config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("config");

	tcase_add_test(tc, table_is_consistent);
	tcase_add_test(tc, defaults);
	tcase_add_test(tc, values);
	tcase_add_test(tc, strings);
	tcase_add_test(tc, file_text);
	tcase_add_test(tc, file_errors);
	tcase_add_test(tc, file_io);
	tcase_add_test(tc, command_line);
	tcase_add_test(tc, trust_rule);
	tcase_add_test(tc, token_sources);
	tcase_add_test(tc, committed_conf_matches);
	tcase_add_test(tc, usage_lists_every_flag);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(config_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
