/* producer/ipc.c: decoding what traced sends: the frame stream, IPCFrame, the bind
 * reply, the async commands and DataSourceConfig. All of it is untrusted input: the
 * decoders read only inside the bytes given (common/pbwire.h's iterator), skip unknown
 * fields (newer services add some), accept non-minimal varints (traced writes some
 * lengths as 4-byte varints) and report malformed messages as -EBADMSG. Field numbers
 * come from the generated protos/ headers. */
#include "producer/producer_internal.h"

#include <errno.h>
#include <string.h>

#include "common/pbwire.h"
#include "protos/data_source.pb.h"
#include "protos/ipc_frame.pb.h"
#include "protos/producer_port.pb.h"

#define F_IPC(x) perfetto_protos_IPCFrame_##x##_tag
#define F_CMD(x) perfetto_protos_GetAsyncCommandResponse_##x##_tag
#define F_DSC(x) perfetto_protos_DataSourceConfig_##x##_tag

const char *const prod__method_names[PROD_M_COUNT] = {
    [PROD_M_INITIALIZE_CONNECTION] = "InitializeConnection",
    [PROD_M_REGISTER_DATA_SOURCE] = "RegisterDataSource",
    [PROD_M_COMMIT_DATA] = "CommitData",
    [PROD_M_GET_ASYNC_COMMAND] = "GetAsyncCommand",
    [PROD_M_REGISTER_TRACE_WRITER] = "RegisterTraceWriter",
    [PROD_M_UNREGISTER_TRACE_WRITER] = "UnregisterTraceWriter",
    [PROD_M_NOTIFY_DATA_SOURCE_STOPPED] = "NotifyDataSourceStopped",
};

long prod__split_frames(const uint8_t *p, size_t len,
                        void (*fn)(void *ctx, const uint8_t *frame, size_t len), void *ctx)
{
    size_t off = 0;
    while (len - off >= PROD_IPC_HEADER) {
        const uint8_t *h = p + off;
        uint32_t n =
            (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        if (n > PROD_IPC_MAX_FRAME - PROD_IPC_HEADER)
            return -EMSGSIZE;
        if (len - off - PROD_IPC_HEADER < n)
            break;
        /* A zero-length frame carries nothing (Perfetto's reader skips it too). */
        if (n)
            fn(ctx, h + PROD_IPC_HEADER, n);
        off += PROD_IPC_HEADER + n;
    }
    return (long)off;
}

int prod__decode_frame(const uint8_t *p, size_t len, struct prod__frame *ret)
{
    struct prod__frame f = {0};
    struct hp_pb_iter it;
    struct hp_pb_field fl;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &fl)) {
        if (fl.num == F_IPC(request_id) && fl.wire_type == HP_PB_VARINT) {
            f.request_id = fl.varint;
            continue;
        }
        if (fl.wire_type != HP_PB_LEN)
            continue;
        enum prod_frame_kind k = PROD_FRAME_NONE;
        switch (fl.num) {
        case F_IPC(msg_bind_service):
            k = PROD_FRAME_BIND;
            break;
        case F_IPC(msg_bind_service_reply):
            k = PROD_FRAME_BIND_REPLY;
            break;
        case F_IPC(msg_invoke_method):
            k = PROD_FRAME_INVOKE;
            break;
        case F_IPC(msg_invoke_method_reply):
            k = PROD_FRAME_INVOKE_REPLY;
            break;
        case F_IPC(msg_request_error):
            k = PROD_FRAME_REQUEST_ERROR;
            break;
        default:
            continue;
        }
        /* A oneof: the last one wins. */
        f.kind = k;
        f.msg = fl.ptr;
        f.msg_len = fl.len;
    }
    if (it.error)
        return -EBADMSG;
    if (f.kind == PROD_FRAME_INVOKE_REPLY) {
        hp_pb_iter_init(&it, f.msg, f.msg_len);
        while (hp_pb_next(&it, &fl)) {
            if (fl.num == perfetto_protos_IPCFrame_InvokeMethodReply_success_tag &&
                fl.wire_type == HP_PB_VARINT)
                f.success = fl.varint != 0;
            else if (fl.num == perfetto_protos_IPCFrame_InvokeMethodReply_has_more_tag &&
                     fl.wire_type == HP_PB_VARINT)
                f.has_more = fl.varint != 0;
            else if (fl.num == perfetto_protos_IPCFrame_InvokeMethodReply_reply_proto_tag &&
                     fl.wire_type == HP_PB_LEN) {
                f.reply = fl.ptr;
                f.reply_len = fl.len;
            }
        }
        if (it.error)
            return -EBADMSG;
    }
    *ret = f;
    return 0;
}

int prod__decode_bind_reply(const uint8_t *p, size_t len, uint32_t *ret_service_id,
                            uint32_t method_ids[PROD_M_COUNT])
{
    uint32_t ids[PROD_M_COUNT] = {0};
    bool success = false;
    uint64_t service_id = 0;
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == perfetto_protos_IPCFrame_BindServiceReply_success_tag &&
            f.wire_type == HP_PB_VARINT) {
            success = f.varint != 0;
        } else if (f.num == perfetto_protos_IPCFrame_BindServiceReply_service_id_tag &&
                   f.wire_type == HP_PB_VARINT) {
            service_id = f.varint;
        } else if (f.num == perfetto_protos_IPCFrame_BindServiceReply_methods_tag &&
                   f.wire_type == HP_PB_LEN) {
            uint64_t id = 0;
            const uint8_t *name = NULL;
            size_t name_len = 0;
            struct hp_pb_iter mi;
            struct hp_pb_field mf;
            hp_pb_iter_init(&mi, f.ptr, f.len);
            while (hp_pb_next(&mi, &mf)) {
                if (mf.num == perfetto_protos_IPCFrame_BindServiceReply_MethodInfo_id_tag &&
                    mf.wire_type == HP_PB_VARINT)
                    id = mf.varint;
                else if (mf.num == perfetto_protos_IPCFrame_BindServiceReply_MethodInfo_name_tag &&
                         mf.wire_type == HP_PB_LEN) {
                    name = mf.ptr;
                    name_len = mf.len;
                }
            }
            if (mi.error)
                return -EBADMSG;
            if (!name || id == 0 || id > UINT32_MAX)
                continue;
            for (int m = 0; m < PROD_M_COUNT; m++)
                if (strlen(prod__method_names[m]) == name_len &&
                    memcmp(prod__method_names[m], name, name_len) == 0)
                    ids[m] = (uint32_t)id;
        }
    }
    if (it.error)
        return -EBADMSG;
    if (!success || service_id > UINT32_MAX)
        return -ENOENT;
    for (int m = 0; m < PROD_M_COUNT; m++)
        if (!ids[m])
            return -ENOENT;
    *ret_service_id = (uint32_t)service_id;
    memcpy(method_ids, ids, sizeof(ids));
    return 0;
}

static uint32_t clamp32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

int prod__decode_ds_config(const uint8_t *p, size_t len, struct prod_ds_config *ret)
{
    struct prod_ds_config c = {0};
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type == HP_PB_VARINT) {
            switch (f.num) {
            case F_DSC(target_buffer):
                c.target_buffer = clamp32(f.varint);
                break;
            case F_DSC(trace_duration_ms):
                c.trace_duration_ms = clamp32(f.varint);
                break;
            case F_DSC(stop_timeout_ms):
                c.stop_timeout_ms = clamp32(f.varint);
                break;
            case F_DSC(tracing_session_id):
                c.tracing_session_id = f.varint;
                break;
            case F_DSC(enable_extra_guardrails):
                c.enable_extra_guardrails = f.varint != 0;
                break;
            default:
                break;
            }
        } else if (f.wire_type == HP_PB_LEN && f.num == F_DSC(heapprofd_config)) {
            c.heapprofd_config = f.ptr;
            c.heapprofd_config_len = f.len;
        }
    }
    if (it.error)
        return -EBADMSG;
    *ret = c;
    return 0;
}

/* Reads {new_instance_id|instance_id = 1, config = 2} of Setup/Start/Stop. */
static int decode_instance(const uint8_t *p, size_t len, struct prod__command *c)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    const uint8_t *cfg = NULL;
    size_t cfg_len = 0;
    uint64_t id = 0;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == F_CMD(SetupDataSource_new_instance_id) && f.wire_type == HP_PB_VARINT)
            id = f.varint;
        else if (f.num == F_CMD(SetupDataSource_config) && f.wire_type == HP_PB_LEN) {
            cfg = f.ptr;
            cfg_len = f.len;
        }
    }
    if (it.error)
        return -EBADMSG;
    if (cfg && prod__decode_ds_config(cfg, cfg_len, &c->config) < 0)
        return -EBADMSG;
    c->config.instance_id = id;
    return 0;
}

/* Repeated uint64 ids (field 1), packed or not. */
static int decode_ids(const uint8_t *p, size_t len, struct prod__command *c)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == F_CMD(Flush_data_source_ids) &&
            (f.wire_type == HP_PB_VARINT || f.wire_type == HP_PB_LEN)) {
            struct hp_pb_ints ints;
            uint64_t v;
            bool err = false;
            hp_pb_ints_init(&ints, &f);
            while (hp_pb_ints_next(&ints, &v, &err)) {
                if (c->n_ids < PROD_MAX_CMD_IDS)
                    c->ids[c->n_ids++] = v;
                else
                    c->ids_truncated = true;
            }
            if (err)
                return -EBADMSG;
        } else if (f.num == F_CMD(Flush_request_id) && f.wire_type == HP_PB_VARINT) {
            c->request_id = f.varint;
        } else if (f.num == F_CMD(Flush_flags) && f.wire_type == HP_PB_VARINT) {
            c->flags = f.varint;
        }
    }
    return it.error ? -EBADMSG : 0;
}

int prod__decode_command(const uint8_t *p, size_t len, struct prod__command *ret)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    const uint8_t *body = NULL;
    size_t body_len = 0;
    enum prod_cmd_kind kind = PROD_CMD_UNKNOWN;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_LEN)
            continue;
        enum prod_cmd_kind k;
        switch (f.num) {
        case F_CMD(setup_tracing):
            k = PROD_CMD_SETUP_TRACING;
            break;
        case F_CMD(setup_data_source):
            k = PROD_CMD_SETUP_DS;
            break;
        case F_CMD(start_data_source):
            k = PROD_CMD_START_DS;
            break;
        case F_CMD(stop_data_source):
            k = PROD_CMD_STOP_DS;
            break;
        case F_CMD(flush):
            k = PROD_CMD_FLUSH;
            break;
        case F_CMD(clear_incremental_state):
            k = PROD_CMD_CLEAR_STATE;
            break;
        default:
            continue;
        }
        kind = k;
        body = f.ptr;
        body_len = f.len;
    }
    if (it.error)
        return -EBADMSG;
    memset(ret, 0, sizeof(*ret));
    ret->kind = kind;
    switch (kind) {
    case PROD_CMD_SETUP_TRACING:
        hp_pb_iter_init(&it, body, body_len);
        while (hp_pb_next(&it, &f))
            if (f.num == F_CMD(SetupTracing_shared_buffer_page_size_kb) &&
                f.wire_type == HP_PB_VARINT)
                ret->page_size_kb = clamp32(f.varint);
        return it.error ? -EBADMSG : 0;
    case PROD_CMD_SETUP_DS:
    case PROD_CMD_START_DS:
    case PROD_CMD_STOP_DS:
        /* StopDataSource's instance_id is field 1 too; it has no config. */
        return decode_instance(body, body_len, ret);
    case PROD_CMD_FLUSH:
    case PROD_CMD_CLEAR_STATE:
        return decode_ids(body, body_len, ret);
    case PROD_CMD_UNKNOWN:
        break;
    }
    return 0;
}
