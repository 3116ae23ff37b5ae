/* protos/fields.h: short names for the field numbers nanopb generates from the Perfetto
 * protos, for the code that encodes or decodes them by hand (bookkeeping/dump.c and
 * samples.c, report/, the trace checker).
 *
 * Each macro pastes a field name onto a message's generated `..._tag` constant, so a
 * misspelt field, or one missing from protos/, is a compile error, and every number
 * comes from the .proto files (whose numbers are Perfetto's).
 *
 *     put_uint(e, PF_FRAME(rel_pc), f->rel_pc);
 *     if (f.num == PF_DUMP(heap_name) && f.wire_type == HP_PB_LEN) ...
 *
 * Compile-time constants only.
 */
#ifndef HP_PROTOS_FIELDS_H
#define HP_PROTOS_FIELDS_H

#include "protos/trace.pb.h"
#include "protos/trace_packet.pb.h"

#define PF_TRACE(f) perfetto_protos_Trace_##f##_tag
#define PF_PACKET(f) perfetto_protos_TracePacket_##f##_tag
#define PF_INTERNED(f) perfetto_protos_InternedData_##f##_tag
#define PF_STRING(f) perfetto_protos_InternedString_##f##_tag
#define PF_MAPPING(f) perfetto_protos_Mapping_##f##_tag
#define PF_FRAME(f) perfetto_protos_Frame_##f##_tag
#define PF_CALLSTACK(f) perfetto_protos_Callstack_##f##_tag
#define PF_PROFILE(f) perfetto_protos_ProfilePacket_##f##_tag
/* ProfilePacket.ProcessHeapSamples: one process's (and heap's) dump. */
#define PF_DUMP(f) perfetto_protos_ProfilePacket_ProcessHeapSamples_##f##_tag
#define PF_SAMPLE(f) perfetto_protos_ProfilePacket_HeapSample_##f##_tag

/* heapprof's own heap (ProcessHeapSamples.heap_name): the allocations of a process whose
 * free may have been lost (frees could not be recorded while they were live), kept out
 * of its "libc.malloc" heap, where they count as freed. Its samples are live
 * allocations whose free was not seen; est_alloc_count is not written. A reader that
 * knows it shows them apart from unreleased memory; Perfetto shows it as one more heap. */
#define PF_HEAP_POSSIBLY_FREED "libc.malloc.possibly_freed"
#define PF_STATS(f) perfetto_protos_ProfilePacket_ProcessStats_##f##_tag
#define PF_HISTOGRAM(f) perfetto_protos_ProfilePacket_Histogram_##f##_tag
#define PF_BUCKET(f) perfetto_protos_ProfilePacket_Histogram_Bucket_##f##_tag
#define PF_TREE(f) perfetto_protos_ProcessTree_##f##_tag
#define PF_PROCESS(f) perfetto_protos_ProcessTree_Process_##f##_tag
#define PF_MODULE(f) perfetto_protos_ModuleSymbols_##f##_tag
#define PF_ADDRESS(f) perfetto_protos_AddressSymbols_##f##_tag
#define PF_LINE(f) perfetto_protos_Line_##f##_tag

/* TracePacket.sequence_flags bits. */
#define PF_SEQ_INCREMENTAL_STATE_CLEARED                                                           \
    perfetto_protos_TracePacket_SequenceFlags_SEQ_INCREMENTAL_STATE_CLEARED
#define PF_SEQ_NEEDS_INCREMENTAL_STATE                                                             \
    perfetto_protos_TracePacket_SequenceFlags_SEQ_NEEDS_INCREMENTAL_STATE

#endif
