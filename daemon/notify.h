/*
 * notify — sd_notify(3) messages for systemd's Type=notify units: READY, STATUS,
 * RELOADING (with MONOTONIC_USEC) and STOPPING. Built with libsystemd when
 * MF_HAVE_SYSTEMD is defined; otherwise every call is a no-op. Outside systemd
 * (no NOTIFY_SOCKET) the calls do nothing either.
 * Ownership: no state; daemon.c sends READY once serving, RELOADING / READY around a
 * SIGHUP, STOPPING when draining begins.
 * Thread safety: any thread (sd_notify is stateless).
 */
#ifndef MFD_NOTIFY_H
#define MFD_NOTIFY_H

void mfd_notify_ready(const char *status);
void mfd_notify_status(const char *status);
void mfd_notify_reloading(void);
void mfd_notify_stopping(void);

#endif /* MFD_NOTIFY_H */
