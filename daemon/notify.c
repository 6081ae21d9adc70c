/* notify — sd_notify wrappers (see notify.h). */
#include "notify.h"
#include "mf_clock.h"

#ifdef MF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#include <time.h>

void mfd_notify_ready(const char *status)
{
    sd_notifyf(0, "READY=1\nSTATUS=%s", status ? status : "ready");
}

void mfd_notify_status(const char *status)
{
    sd_notifyf(0, "STATUS=%s", status);
}

void mfd_notify_reloading(void)
{
    unsigned long long usec = (unsigned long long)mf_now_us();
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading configuration", usec);
}

void mfd_notify_stopping(void)
{
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
}
#else
void mfd_notify_ready(const char *status) { (void)status; }
void mfd_notify_status(const char *status) { (void)status; }
void mfd_notify_reloading(void) {}
void mfd_notify_stopping(void) {}
#endif
