/*
 * pbjson.c - the proto3 JSON mapping over protobuf-c descriptors
 * (pbjson.h).  One walk per direction: a field's storage is found by its
 * descriptor (offset, quantifier_offset, label, type), as protobuf-c's own
 * packer finds it.
 */
#include "pbjson.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pbjson_field_name(const char *proto_name, char *out, size_t outlen) {
  size_t n = 0;
  bool upper = false;
  for (const char *p = proto_name; *p && n + 1 < outlen; p++) {
    if (*p == '_') {
      upper = true;
      continue;
    }
    char c = *p;
    if (upper && c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
    upper = false;
    out[n++] = c;
  }
  out[n] = '\0';
}

/* Bytes one element of a field takes in its message (or its array). */
static size_t field_size(ProtobufCType type) {
  switch (type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
      return sizeof(int32_t);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
      return sizeof(uint32_t);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
      return sizeof(int64_t);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
      return sizeof(uint64_t);
    case PROTOBUF_C_TYPE_FLOAT:
      return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
      return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
      return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
      return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
      return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
      return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
      return sizeof(ProtobufCMessage *);
  }
  return 0;
}

/* ------------------------------------------------------ message -> JSON */

static cJSON *number_json(double v) {
  if (isnan(v)) return cJSON_CreateString("NaN");
  if (isinf(v)) return cJSON_CreateString(v > 0 ? "Infinity" : "-Infinity");
  return cJSON_CreateNumber(v);
}

static cJSON *bytes_json(const ProtobufCBinaryData *b) {
  if (b->len > ((size_t)1 << 30)) return NULL;
  size_t cap = 4 * ((b->len + 2) / 3) + 1;
  char *text = malloc(cap);
  if (text == NULL) return NULL;
  EVP_EncodeBlock((unsigned char *)text, b->data, (int)b->len);
  cJSON *j = cJSON_CreateString(text);
  free(text);
  return j;
}

static cJSON *value_json(const ProtobufCFieldDescriptor *f, const void *p) {
  char digits[32];
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
      return cJSON_CreateNumber(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
      return cJSON_CreateNumber(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
      snprintf(digits, sizeof digits, "%" PRId64, *(const int64_t *)p);
      return cJSON_CreateString(digits);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
      snprintf(digits, sizeof digits, "%" PRIu64, *(const uint64_t *)p);
      return cJSON_CreateString(digits);
    case PROTOBUF_C_TYPE_FLOAT:
      return number_json(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
      return number_json(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
      return cJSON_CreateBool(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
      int v = *(const int *)p;
      const ProtobufCEnumValue *ev =
          protobuf_c_enum_descriptor_get_value(f->descriptor, v);
      return ev ? cJSON_CreateString(ev->name) : cJSON_CreateNumber(v);
    }
    case PROTOBUF_C_TYPE_STRING: {
      const char *s = *(char *const *)p;
      return cJSON_CreateString(s ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES:
      return bytes_json(p);
    case PROTOBUF_C_TYPE_MESSAGE: {
      const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
      return m ? pbjson_from_message(m) : cJSON_CreateNull();
    }
  }
  return NULL;
}

cJSON *pbjson_from_message(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *desc = m->descriptor;
  cJSON *obj = cJSON_CreateObject();
  if (obj == NULL) return NULL;
  const char *base = (const char *)m;
  for (unsigned i = 0; i < desc->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &desc->fields[i];
    const void *at = base + f->offset;
    cJSON *value = NULL;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      const char *items = *(char *const *)at;
      value = cJSON_CreateArray();
      size_t size = field_size(f->type);
      for (size_t k = 0; value && k < n; k++) {
        cJSON *item = value_json(f, items + k * size);
        if (item == NULL || !cJSON_AddItemToArray(value, item)) {
          cJSON_Delete(item);
          cJSON_Delete(value);
          value = NULL;
        }
      }
    } else {
      bool present = true;
      if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        present = *(const uint32_t *)(base + f->quantifier_offset) == f->id;
      else if (f->type == PROTOBUF_C_TYPE_MESSAGE)
        present = *(ProtobufCMessage *const *)at != NULL;
      else if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
               f->quantifier_offset != 0)
        present = *(const protobuf_c_boolean *)(base + f->quantifier_offset);
      if (!present) continue;
      value = value_json(f, at);
    }
    char name[128];
    pbjson_field_name(f->name, name, sizeof name);
    if (value == NULL || !cJSON_AddItemToObject(obj, name, value)) {
      cJSON_Delete(value);
      cJSON_Delete(obj);
      return NULL;
    }
  }
  return obj;
}

/* ------------------------------------------------------ JSON -> message */

typedef struct reader {
  char *msg;
  size_t msglen;
  char path[256]; /* the field being read, for messages */
} reader;

static bool fail(reader *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static bool fail(reader *r, const char *fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  snprintf(r->msg, r->msglen, "%s%s%s", r->path, r->path[0] ? ": " : "", text);
  return false;
}

/* An integer of a JSON number (integral) or a decimal string. */
static bool read_integer(reader *r, const cJSON *j, bool is_unsigned,
                         int64_t *sv, uint64_t *uv) {
  if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (!isfinite(d) || d != floor(d))
      return fail(r, "%g is not an integer", d);
    if (is_unsigned) {
      if (d < 0 || d >= 18446744073709551616.0)
        return fail(r, "%g is out of range", d);
      *uv = (uint64_t)d;
    } else {
      if (d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return fail(r, "%g is out of range", d);
      *sv = (int64_t)d;
    }
    return true;
  }
  if (!cJSON_IsString(j)) return fail(r, "expected an integer");
  const char *s = j->valuestring;
  char *end = NULL;
  errno = 0;
  if (s[0] == '\0' || s[0] == ' ' || s[0] == '+' ||
      (is_unsigned && s[0] == '-'))
    return fail(r, "'%.40s' is not an integer", s);
  if (is_unsigned)
    *uv = strtoull(s, &end, 10);
  else
    *sv = strtoll(s, &end, 10);
  if (errno == ERANGE) return fail(r, "'%.40s' is out of range", s);
  if (end == s || *end != '\0') return fail(r, "'%.40s' is not an integer", s);
  return true;
}

static bool read_double(reader *r, const cJSON *j, double *out) {
  if (cJSON_IsNumber(j)) {
    *out = j->valuedouble;
    return true;
  }
  if (cJSON_IsString(j)) {
    if (strcmp(j->valuestring, "NaN") == 0) {
      *out = NAN;
      return true;
    }
    if (strcmp(j->valuestring, "Infinity") == 0) {
      *out = INFINITY;
      return true;
    }
    if (strcmp(j->valuestring, "-Infinity") == 0) {
      *out = -INFINITY;
      return true;
    }
  }
  return fail(r, "expected a number");
}

static bool read_bytes(reader *r, const cJSON *j, ProtobufCBinaryData *out) {
  if (!cJSON_IsString(j)) return fail(r, "expected base64 text");
  size_t n = strlen(j->valuestring);
  if (n > ((size_t)1 << 31) - 4) return fail(r, "too long");
  /* URL-safe letters are taken as standard ones; padding may be left off. */
  char *text = malloc(n + 4);
  if (text == NULL) return fail(r, "out of memory");
  for (size_t i = 0; i < n; i++) {
    char c = j->valuestring[i];
    text[i] = c == '-' ? '+' : c == '_' ? '/' : c;
  }
  while (n % 4) text[n++] = '=';
  text[n] = '\0';
  size_t pad = 0;
  if (n >= 1 && text[n - 1] == '=') pad++;
  if (n >= 2 && text[n - 2] == '=') pad++;
  uint8_t *data = malloc(n / 4 * 3 + 1);
  int got = data ? EVP_DecodeBlock(data, (unsigned char *)text, (int)n) : -1;
  free(text);
  if (got < 0 || (size_t)got < pad) {
    free(data);
    return fail(r, "not base64");
  }
  out->data = data;
  out->len = (size_t)got - pad;
  return true;
}

static ProtobufCMessage *read_message(reader *r,
                                      const ProtobufCMessageDescriptor *desc,
                                      const cJSON *json, int depth);

/* Reads one value of f from j into p (an element or the field itself). */
static bool read_value(reader *r, const ProtobufCFieldDescriptor *f,
                       const cJSON *j, void *p, int depth) {
  int64_t sv = 0;
  uint64_t uv = 0;
  double d = 0;
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
      if (!read_integer(r, j, false, &sv, &uv)) return false;
      if (sv < INT32_MIN || sv > INT32_MAX)
        return fail(r, "%" PRId64 " is out of int32 range", sv);
      *(int32_t *)p = (int32_t)sv;
      return true;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
      if (!read_integer(r, j, true, &sv, &uv)) return false;
      if (uv > UINT32_MAX)
        return fail(r, "%" PRIu64 " is out of uint32 range", uv);
      *(uint32_t *)p = (uint32_t)uv;
      return true;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
      if (!read_integer(r, j, false, &sv, &uv)) return false;
      *(int64_t *)p = sv;
      return true;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
      if (!read_integer(r, j, true, &sv, &uv)) return false;
      *(uint64_t *)p = uv;
      return true;
    case PROTOBUF_C_TYPE_FLOAT:
      if (!read_double(r, j, &d)) return false;
      *(float *)p = (float)d;
      return true;
    case PROTOBUF_C_TYPE_DOUBLE:
      if (!read_double(r, j, &d)) return false;
      *(double *)p = d;
      return true;
    case PROTOBUF_C_TYPE_BOOL:
      if (!cJSON_IsBool(j)) return fail(r, "expected true or false");
      *(protobuf_c_boolean *)p = cJSON_IsTrue(j);
      return true;
    case PROTOBUF_C_TYPE_ENUM: {
      const ProtobufCEnumDescriptor *ed = f->descriptor;
      if (cJSON_IsString(j)) {
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value_by_name(ed, j->valuestring);
        if (ev == NULL) {
          char names[256] = "";
          size_t len = 0;
          for (unsigned k = 0; k < ed->n_values && len < sizeof names; k++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s",
                                    k ? ", " : "", ed->values[k].name);
          return fail(r, "'%.40s' is not one of %s", j->valuestring, names);
        }
        *(int *)p = ev->value;
        return true;
      }
      if (!read_integer(r, j, false, &sv, &uv)) return false;
      if (sv < INT32_MIN || sv > INT32_MAX)
        return fail(r, "%" PRId64 " is out of enum range", sv);
      *(int *)p = (int)sv;
      return true;
    }
    case PROTOBUF_C_TYPE_STRING: {
      if (!cJSON_IsString(j)) return fail(r, "expected a string");
      char *s = strdup(j->valuestring);
      if (s == NULL) return fail(r, "out of memory");
      *(char **)p = s;
      return true;
    }
    case PROTOBUF_C_TYPE_BYTES:
      return read_bytes(r, j, p);
    case PROTOBUF_C_TYPE_MESSAGE: {
      ProtobufCMessage *m = read_message(r, f->descriptor, j, depth + 1);
      if (m == NULL) return false;
      *(ProtobufCMessage **)p = m;
      return true;
    }
  }
  return fail(r, "unsupported field type");
}

static const ProtobufCFieldDescriptor *find_field(
    const ProtobufCMessageDescriptor *desc, const char *key) {
  for (unsigned i = 0; i < desc->n_fields; i++) {
    char name[128];
    pbjson_field_name(desc->fields[i].name, name, sizeof name);
    if (strcmp(key, name) == 0 || strcmp(key, desc->fields[i].name) == 0)
      return &desc->fields[i];
  }
  return NULL;
}

static bool read_field(reader *r, ProtobufCMessage *m,
                       const ProtobufCFieldDescriptor *f, const cJSON *j,
                       int depth) {
  char *base = (char *)m;
  if (cJSON_IsNull(j)) return true; /* the default */
  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    if (!cJSON_IsArray(j)) return fail(r, "expected an array");
    int n = cJSON_GetArraySize(j);
    if (n == 0) return true;
    size_t size = field_size(f->type);
    char *items = calloc((size_t)n, size);
    if (items == NULL) return fail(r, "out of memory");
    /* Counted as it fills, so a failure frees what was read. */
    *(char **)(base + f->offset) = items;
    size_t *count = (size_t *)(base + f->quantifier_offset);
    size_t plen = strlen(r->path);
    int k = 0;
    for (const cJSON *item = j->child; item; item = item->next, k++) {
      snprintf(r->path + plen, sizeof r->path - plen, "[%d]", k);
      if (cJSON_IsNull(item)) return fail(r, "null in an array");
      if (!read_value(r, f, item, items + (size_t)k * size, depth))
        return false;
      *count = (size_t)k + 1;
    }
    r->path[plen] = '\0';
    return true;
  }
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
    uint32_t *which = (uint32_t *)(base + f->quantifier_offset);
    if (*which != 0)
      return fail(r, *which == f->id
                         ? "given twice"
                         : "another member of its oneof is set too");
    /* The member's storage is shared: it must be clean before reading. */
    if (!read_value(r, f, j, base + f->offset, depth)) return false;
    *which = f->id;
    return true;
  }
  if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES ||
      f->type == PROTOBUF_C_TYPE_MESSAGE) {
    /* Given twice ("id" and "id"): the second replaces the first. */
    if (f->type == PROTOBUF_C_TYPE_STRING) {
      char **s = (char **)(base + f->offset);
      if (*s != NULL && *s != f->default_value) free(*s);
      *s = (char *)f->default_value;
    } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
      ProtobufCBinaryData *b = (ProtobufCBinaryData *)(base + f->offset);
      free(b->data);
      b->data = NULL;
      b->len = 0;
    } else {
      ProtobufCMessage **sub = (ProtobufCMessage **)(base + f->offset);
      if (*sub) protobuf_c_message_free_unpacked(*sub, NULL);
      *sub = NULL;
    }
  }
  if (!read_value(r, f, j, base + f->offset, depth)) return false;
  if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset != 0 &&
      f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
    *(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
  return true;
}

static ProtobufCMessage *read_message(reader *r,
                                      const ProtobufCMessageDescriptor *desc,
                                      const cJSON *json, int depth) {
  if (depth > PBJSON_MAX_DEPTH) {
    fail(r, "nested deeper than %d messages", PBJSON_MAX_DEPTH);
    return NULL;
  }
  if (json != NULL && !cJSON_IsObject(json)) {
    fail(r, "expected an object (%s)", desc->name);
    return NULL;
  }
  ProtobufCMessage *m = calloc(1, desc->sizeof_message);
  if (m == NULL) {
    fail(r, "out of memory");
    return NULL;
  }
  protobuf_c_message_init(desc, m);
  size_t plen = strlen(r->path);
  for (const cJSON *j = json ? json->child : NULL; j; j = j->next) {
    const char *key = j->string ? j->string : "";
    snprintf(r->path + plen, sizeof r->path - plen, "%s%s", plen ? "." : "",
             key);
    const ProtobufCFieldDescriptor *f = find_field(desc, key);
    bool ok = f != NULL ? read_field(r, m, f, j, depth)
                        : fail(r, "%s has no such field", desc->name);
    if (!ok) {
      protobuf_c_message_free_unpacked(m, NULL);
      return NULL;
    }
    r->path[plen] = '\0';
  }
  return m;
}

ProtobufCMessage *pbjson_to_message(const ProtobufCMessageDescriptor *desc,
                                    const cJSON *json, char *msg,
                                    size_t msglen) {
  reader r = {.msg = msg, .msglen = msglen, .path = ""};
  return read_message(&r, desc, json, 0);
}
