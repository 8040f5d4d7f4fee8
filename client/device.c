/* device.c -- ap_device_probe: what the CUDA driver says of one GPU, for a
 * request's DeviceInfo (apollo.h).
 *
 * Approach: the driver API loaded with dlopen for the call only
 * ($APOLLO_LIBCUDA, else libcuda.so.1, as the runtime loads it), cuInit,
 * then cuDeviceGet / cuDeviceGetName / cuDeviceGetAttribute and, when the
 * driver has it, cuDriverGetVersion.  Nothing is kept: a client that only
 * compiles pays one dlopen per probe, and a machine without a driver gets
 * a clear error instead of a crash.  Attribute numbers are the CUDA driver
 * API's (CUdevice_attribute): 16 multiprocessor count, 75 and 76 the
 * compute capability's major and minor.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apollo.h"

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_device_get_fn)(int *, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_attr_fn)(int *, int, int);
typedef int (*cu_version_fn)(int *);

int ap_device_probe(int ordinal, ap_device_info *out, ap_error *err)
{
	const char *path = getenv("APOLLO_LIBCUDA");
	void *lib;
	cu_init_fn init;
	cu_device_get_fn get;
	cu_name_fn name;
	cu_attr_fn attr;
	cu_version_fn version;
	int dev = 0, sms = 0, major = 0, minor = 0, drv = 0, r;

	memset(out, 0, sizeof(*out));
	if (!path || !*path)
		path = "libcuda.so.1";
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL, "no CUDA driver: dlopen(%s): %s",
				    path, dlerror());
	init = (cu_init_fn)dlsym(lib, "cuInit");
	get = (cu_device_get_fn)dlsym(lib, "cuDeviceGet");
	name = (cu_name_fn)dlsym(lib, "cuDeviceGetName");
	attr = (cu_attr_fn)dlsym(lib, "cuDeviceGetAttribute");
	version = (cu_version_fn)dlsym(lib, "cuDriverGetVersion");
	if (!init || !get || !name || !attr) {
		dlclose(lib);
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "the CUDA driver %s lacks cuInit, cuDeviceGet, cuDeviceGetName or "
				    "cuDeviceGetAttribute", path);
	}
	if ((r = init(0)) || (r = get(&dev, ordinal)) ||
	    (r = name(out->name, (int)sizeof(out->name) - 1, dev)) || (r = attr(&sms, 16, dev)) ||
	    (r = attr(&major, 75, dev)) || (r = attr(&minor, 76, dev))) {
		dlclose(lib);
		memset(out, 0, sizeof(*out));
		return ap_error_set(err, AP_EIO, NULL, NULL, "CUDA device %d: driver error %d", ordinal,
				    r);
	}
	if (version && version(&drv))
		drv = 0;
	dlclose(lib);
	out->name[sizeof(out->name) - 1] = '\0';
	out->sm_count = sms > 0 ? (unsigned)sms : 0;
	out->cc_major = major > 0 ? (unsigned)major : 0;
	out->cc_minor = minor > 0 ? (unsigned)minor : 0;
	out->driver_version = drv > 0 ? (unsigned)drv : 0;
	if (!out->name[0] || !out->sm_count) {
		memset(out, 0, sizeof(*out));
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "CUDA device %d: the driver gave no name or SM count", ordinal);
	}
	return 0;
}
