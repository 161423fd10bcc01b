/*
 * notify.c - sd_notify for Type=notify units (notify.h).
 *
 * The watchdog is fed from rpc_server_run's loop, which wakes at least
 * every POLL_MS: a loop stuck anywhere stops the pings and systemd
 * restarts the daemon (deploy/toposd.service, WatchdogSec=).
 */
#include "notify.h"

#include <stdio.h>
#include <systemd/sd-daemon.h>

void notify_ready(const char *status) {
  sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void notify_stopping(const char *status) {
  sd_notifyf(0, "STOPPING=1\nSTATUS=%s", status);
}

int64_t notify_watchdog_period_ns(void) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return 0;
  return (int64_t)(usec * 1000 / 2);
}

void notify_watchdog(void) {
  sd_notify(0, "WATCHDOG=1");
}
