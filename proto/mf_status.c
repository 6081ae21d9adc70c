/* mf_status — names and messages generated from MF_STATUS_MAP. */
#include "mf_status.h"

const char *mf_status_name(int status)
{
    switch (status) {
#define MF_STATUS_NAME_(name, num, msg) case num: return #name;
        MF_STATUS_MAP(MF_STATUS_NAME_)
#undef MF_STATUS_NAME_
    }
    return "UNKNOWN_STATUS";
}

const char *mf_strerror(int status)
{
    switch (status) {
#define MF_STATUS_MSG_(name, num, msg) case num: return msg;
        MF_STATUS_MAP(MF_STATUS_MSG_)
#undef MF_STATUS_MSG_
    }
    return "unknown status code";
}

int mf_status_valid(int status)
{
    return status >= 0 && status < MF_STATUS_COUNT;
}
