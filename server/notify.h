/*
 * notify.h - systemd's service notifications (sd_notify, libsystemd):
 * READY=1 once the daemon serves, STOPPING=1 when it drains, and the
 * watchdog's WATCHDOG=1 from the completion-queue loop.  Each is a no-op
 * when the daemon was not started by systemd with Type=notify (no
 * $NOTIFY_SOCKET) or, for the watchdog, without WatchdogSec= (no
 * $WATCHDOG_USEC).
 */
#ifndef TOPOSD_NOTIFY_H
#define TOPOSD_NOTIFY_H

#include <stdint.h>

/* READY=1 with a STATUS= line ("serving on 127.0.0.1:50051"). */
void notify_ready(const char *status);
/* STOPPING=1 with a STATUS= line. */
void notify_stopping(const char *status);
/* How often to send WATCHDOG=1, in nanoseconds: half the interval systemd
 * asked for, or 0 when it asked for none. */
int64_t notify_watchdog_period_ns(void);
/* WATCHDOG=1. */
void notify_watchdog(void);

#endif /* TOPOSD_NOTIFY_H */
