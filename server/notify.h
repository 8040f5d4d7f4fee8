/* notify.h -- the systemd service manager protocols apollod speaks, written
 * here from their specifications rather than linked from libsystemd:
 *
 *   sd_notify (systemd's sd_notify(3), "Notify socket" in systemd.exec):
 *     a service of Type=notify tells the manager it is ready by sending
 *     the datagram "READY=1" to the AF_UNIX socket named by $NOTIFY_SOCKET
 *     (a path, or "@name" for the abstract namespace); WatchdogSec= sets
 *     $WATCHDOG_USEC (and $WATCHDOG_PID), and the service must send
 *     "WATCHDOG=1" more often than that; "STOPPING=1" announces a clean
 *     stop, "STATUS=..." a line for `systemctl status`.
 *   socket activation (sd_listen_fds(3)): the manager passes listening
 *     sockets as file descriptors 3, 4, ... with $LISTEN_FDS (how many)
 *     and $LISTEN_PID (the pid they are meant for).
 *
 * Why by hand: each protocol is a few lines over plain sockets and
 * environment variables, stable and documented; libsystemd (Debian's
 * libsystemd-dev) would add a dependency to a daemon that most often runs
 * without systemd (tests, containers, the demo), for two functions.
 */
#ifndef AP_NOTIFY_H
#define AP_NOTIFY_H

#include "../common/base.h"

/* Sends `state` (e.g. "READY=1\nSTATUS=listening") to $NOTIFY_SOCKET.
 * 1 sent, 0 when $NOTIFY_SOCKET is not set (not run by a manager that
 * wants it), AP_EIO when it could not be sent. */
int ap_notify(const char *state);

/* The watchdog interval the manager asked for, microseconds: $WATCHDOG_USEC
 * when set and $WATCHDOG_PID is unset or this process; else 0. */
uint64_t ap_notify_watchdog_usec(void);

/* Socket activation: the number of listening descriptors passed to this
 * process (3 .. 3+n-1), 0 when none ($LISTEN_PID names another process,
 * or the variables are unset or malformed).  The variables are removed from
 * the environment (the compiler processes apollod starts must not take the
 * sockets for theirs) and each descriptor is made close-on-exec. */
int ap_listen_fds(void);

#endif
