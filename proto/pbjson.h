/*
 * pbjson.h - protobuf messages as JSON and back, by their protobuf-c
 * descriptors: the proto3 JSON mapping the HTTP gateway speaks, for every
 * message of proto/topos.proto without a line per message.
 *
 * The mapping (protobuf's "JSON Mapping", as grpc-gateway and protojson
 * write it): fields by their lowerCamelCase JSON names (the proto names
 * are accepted too); 64-bit integers as decimal strings (numbers are
 * accepted); float and double as numbers, or "NaN", "Infinity",
 * "-Infinity"; bytes as standard base64; enums by name (numbers are
 * accepted); repeated fields as arrays; null as the field's default.
 * Written JSON has every singular and repeated field (defaults too, so a
 * reader sees the whole shape), a oneof's member only when set, and a
 * message field only when present.
 *
 * Reading treats the JSON as hostile: an unknown field, a value of the
 * wrong JSON type, an integer out of its field's range or not integral,
 * bad base64 or an unknown enum name fails with the field's path
 * ("entry.roots[0].index: ...").  Nesting deeper than PBJSON_MAX_DEPTH
 * messages fails too.
 */
#ifndef TOPOS_PBJSON_H
#define TOPOS_PBJSON_H

#include <cJSON.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

#define PBJSON_MAX_DEPTH 32

/* m as a JSON object (cJSON_Delete it), or NULL when out of memory. */
cJSON *pbjson_from_message(const ProtobufCMessage *m);

/* A new message of desc from a JSON object (NULL json: the empty
 * message), every part from malloc: free it with
 * protobuf_c_message_free_unpacked(m, NULL).  NULL with msg on failure. */
ProtobufCMessage *pbjson_to_message(const ProtobufCMessageDescriptor *desc,
                                    const cJSON *json, char *msg,
                                    size_t msglen);

/* The lowerCamelCase JSON name of a proto field name ("peak_bytes" ->
 * "peakBytes") into out. */
void pbjson_field_name(const char *proto_name, char *out, size_t outlen);

#endif /* TOPOS_PBJSON_H */
