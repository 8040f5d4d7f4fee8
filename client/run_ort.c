/* run_ort.c -- onnxruntime's outputs for a model and its inputs: the
 * reference of `apollo-client run --compare onnxruntime` and of `check
 * MODEL.onnx`.
 *
 * onnxruntime is a Python package, so the work is done by a script shipped
 * in the repository (tools/ort_reference.py) in a child process: no shell,
 * argv only (posix_spawnp).  Inputs and outputs travel as .npy files
 * (npy.c) in a private temporary folder that is removed afterwards, so
 * nothing depends on the child's stdout.  The script says "cannot import"
 * with exit status 3; that, a missing interpreter or a missing script make
 * the reference unavailable, which the command reports apart from a
 * mismatch.
 */
#include "tool.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

extern char **environ;

#define ORT_UNAVAILABLE 3    /* ort_reference.py: numpy or onnxruntime cannot be imported */

/* The folder of the running executable into buf (cap bytes); false when
 * /proc/self/exe does not say. */
static bool exe_folder(char *buf, size_t cap)
{
	ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
	char *slash;

	if (n <= 0)
		return false;
	buf[n] = 0;
	if (!(slash = strrchr(buf, '/')))
		return false;
	*slash = 0;
	return true;
}

/* A file Apollo needs, into out (cap bytes): $ENV when set (as given),
 * else EXE_FOLDER/rel_exe, else rel_cwd, the first that access(mode)
 * allows.  False when none is there. */
static bool find_file(const char *env, const char *rel_exe, const char *rel_cwd, int mode,
		      char *out, size_t cap)
{
	const char *e = getenv(env);
	char exe[PATH_MAX];

	if (e && *e) {
		snprintf(out, cap, "%s", e);
		return true;
	}
	if (exe_folder(exe, sizeof(exe)) &&
	    (size_t)snprintf(out, cap, "%s/%s", exe, rel_exe) < cap && access(out, mode) == 0)
		return true;
	return (size_t)snprintf(out, cap, "%s", rel_cwd) < cap && access(out, mode) == 0;
}

/* Removes the temporary folder and every file in it. */
static void remove_tmp(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char path[PATH_MAX];

	while (d && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    (size_t)snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) < sizeof(path))
			unlink(path);
	if (d)
		closedir(d);
	rmdir(dir);
}

/* Writes the inputs as DIR/input_K.npy and fills argv from argv[at] on:
 * NAME PATH for each (paths malloc'd into paths[k]). */
static int write_inputs(const char *dir, ap_host_tensor *const *in, int n_in, char **paths,
			char **argv, int at, ap_error *err)
{
	for (int k = 0; k < n_in; k++) {
		int rc;

		if (asprintf(&paths[k], "%s/input_%d.npy", dir, k) < 0) {
			paths[k] = NULL;
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		}
		if ((rc = ap_npy_write(paths[k], in[k], err)) < 0)
			return rc;
		argv[at + 2 * k] = in[k]->name ? in[k]->name : (char *)"";
		argv[at + 2 * k + 1] = paths[k];
	}
	return 0;
}

/* Runs argv and waits: its exit status (0-255), or AP_EIO / a spawn's
 * errno as AP_EUNSUPPORTED with *unavailable. */
static int spawn_wait(char **argv, bool *unavailable, ap_error *err)
{
	pid_t pid;
	int st, e = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);

	if (e) {
		*unavailable = true;
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "cannot run the Python interpreter '%s' for onnxruntime: %s; "
				    "set $APOLLO_PYTHON to one that has onnxruntime", argv[0],
				    strerror(e));
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return ap_error_set(err, AP_EIO, NULL, NULL, "waiting for %s: %s", argv[0],
					    strerror(errno));
	if (WIFSIGNALED(st))
		return ap_error_set(err, AP_EIO, NULL, NULL, "the onnxruntime reference (%s) was "
				    "killed by signal %d", argv[1], WTERMSIG(st));
	return WEXITSTATUS(st);
}

/* Reads DIR/output_K.npy for each of io's outputs. */
static int read_outputs(const char *dir, const ap_onnx_io *io, ap_host_tensor ***out,
			int *n_out, ap_error *err)
{
	ap_host_tensor **t = calloc((size_t)io->n_outputs + 1, sizeof(*t));
	char path[PATH_MAX];

	if (!t)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int k = 0; k < io->n_outputs; k++) {
		int rc;

		snprintf(path, sizeof(path), "%s/output_%d.npy", dir, k);
		if ((rc = ap_npy_read(path, io->outputs[k], &t[k], err)) < 0) {
			ap_host_tensors_free(t, k);
			return rc;
		}
	}
	*out = t;
	*n_out = io->n_outputs;
	return 0;
}

int ap_ort_run(const char *model, const ap_onnx_io *io, ap_host_tensor *const *in, int n_in,
	       ap_host_tensor ***out, int *n_out, bool *unavailable, ap_error *err)
{
	char python[PATH_MAX], script[PATH_MAX], dir[PATH_MAX], outdir[PATH_MAX];
	const char *tmp = getenv("TMPDIR");
	char **argv = calloc((size_t)(5 + 2 * n_in), sizeof(char *));
	char **paths = calloc((size_t)n_in + 1, sizeof(char *));
	int rc;

	*out = NULL;
	*n_out = 0;
	*unavailable = false;
	if (!argv || !paths) {
		free(argv);
		free(paths);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	if (!find_file("APOLLO_PYTHON", "../.venv/bin/python", ".venv/bin/python", X_OK, python,
		       sizeof(python)))
		snprintf(python, sizeof(python), "python3");
	dir[0] = 0;
	if (!find_file("APOLLO_ORT_REFERENCE", "../tools/ort_reference.py",
		       "tools/ort_reference.py", R_OK, script, sizeof(script))) {
		*unavailable = true;
		rc = ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				  "the onnxruntime reference script tools/ort_reference.py is not "
				  "beside this executable (../tools/) nor in the current folder: set "
				  "$APOLLO_ORT_REFERENCE to its path");
		goto out;
	}
	snprintf(dir, sizeof(dir), "%s/apollo-run.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "cannot make a temporary folder %s: %s",
				  dir, strerror(errno));
		dir[0] = 0;
		goto out;
	}
	snprintf(outdir, sizeof(outdir), "%s", dir);
	argv[0] = python;
	argv[1] = script;
	argv[2] = (char *)model;
	argv[3] = outdir;
	if ((rc = write_inputs(dir, in, n_in, paths, argv, 4, err)) < 0)
		goto out;
	rc = spawn_wait(argv, unavailable, err);
	if (rc == ORT_UNAVAILABLE) {
		*unavailable = true;
		rc = ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				  "onnxruntime cannot be imported by %s: install it there (%s -m pip "
				  "install onnxruntime numpy; `make deps` makes the repository's "
				  ".venv), or set $APOLLO_PYTHON to an interpreter that has it",
				  python, python);
	} else if (rc > 0) {
		rc = ap_error_set(err, AP_EINVAL, NULL, NULL,
				  "onnxruntime failed on %s (%s exited with %d; its message is above)",
				  model, script, rc);
	} else if (rc == 0) {
		rc = read_outputs(dir, io, out, n_out, err);
	}
out:
	if (dir[0])
		remove_tmp(dir);
	for (int k = 0; k < n_in; k++)
		free(paths[k]);
	free(paths);
	free(argv);
	return rc;
}
