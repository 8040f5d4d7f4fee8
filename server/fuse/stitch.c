/* stitch.c -- Layer II, memory stitching (see fuse.h): stitches nothing
 * yet; the stitched-reduction emitter comes next. */
#include "fuse.h"

int ap_fuse_stitch(ap_partition *p, ap_mgraph ***ms, int *n, const bool *no_stitch,
		   const ap_target_info *t, unsigned *n_stitched, ap_error *err)
{
	*n_stitched = 0;
	return 0;
}
