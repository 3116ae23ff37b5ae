/* producer/request.c: what the connection sends to traced and the requests it waits on:
 * the send queue of length-prefixed IPC frames (written out by conn.c when the socket
 * takes them) and the ids of the requests whose replies are wanted. Owner thread only. */
#include "producer/producer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "common/pbwire.h"
#include "protos/ipc_frame.pb.h"

static bool tx_reserve(prod_t *p, size_t n)
{
    return hp_grow((void **)&p->tx, &p->tx_cap, p->tx_len + n, 1) == 0;
}

void prod__track_req(prod_t *p, uint64_t id, enum prod__req_kind kind)
{
    if (hp_grow((void **)&p->reqs, &p->cap_reqs, p->n_reqs + 1, sizeof(*p->reqs)) < 0)
        return; /* the reply will be dropped as unknown */
    p->reqs[p->n_reqs++] = (struct prod__req){id, kind};
}

/* Appends one frame holding @frame (an IPCFrame) to the send queue. Out of memory the
 * frame is lost whole (the request goes unanswered), never cut. */
void prod__send_frame(prod_t *p, const struct hp_pbw *frame)
{
    if (!tx_reserve(p, PROD_IPC_HEADER + frame->len))
        return;
    uint8_t *q = p->tx + p->tx_len;
    q[0] = (uint8_t)frame->len;
    q[1] = (uint8_t)(frame->len >> 8);
    q[2] = (uint8_t)(frame->len >> 16);
    q[3] = (uint8_t)(frame->len >> 24);
    memcpy(q + PROD_IPC_HEADER, frame->p, frame->len);
    p->tx_len += PROD_IPC_HEADER + frame->len;
}

/* Invokes @method with the serialized request @args (emptied). Returns the request id. */
uint64_t prod__invoke(prod_t *p, enum prod_method m, struct hp_pbw *args, bool drop_reply,
                      enum prod__req_kind kind)
{
    struct hp_pbw inv = {0}, fr = {0};
    uint64_t id = p->next_req++;
    hp_pbw_uint_always(&inv, perfetto_protos_IPCFrame_InvokeMethod_service_id_tag, p->service_id);
    hp_pbw_uint_always(&inv, perfetto_protos_IPCFrame_InvokeMethod_method_id_tag, p->methods[m]);
    hp_pbw_len(&inv, perfetto_protos_IPCFrame_InvokeMethod_args_proto_tag, args->p, args->len);
    if (drop_reply)
        hp_pbw_uint(&inv, perfetto_protos_IPCFrame_InvokeMethod_drop_reply_tag, 1);
    hp_pbw_uint_always(&fr, perfetto_protos_IPCFrame_request_id_tag, id);
    hp_pbw_msg(&fr, perfetto_protos_IPCFrame_msg_invoke_method_tag, &inv);
    if (!fr.oom && !args->oom)
        prod__send_frame(p, &fr);
    if (!drop_reply)
        prod__track_req(p, id, kind);
    free(inv.p);
    free(fr.p);
    free(args->p);
    *args = (struct hp_pbw){0};
    return id;
}

bool prod__take_req(prod_t *p, uint64_t id, enum prod__req_kind *ret)
{
    for (size_t i = 0; i < p->n_reqs; i++) {
        if (p->reqs[i].id != id)
            continue;
        *ret = p->reqs[i].kind;
        if (*ret != PROD_REQ_ASYNC) /* a stream answers many times */
            p->reqs[i] = p->reqs[--p->n_reqs];
        return true;
    }
    return false;
}
