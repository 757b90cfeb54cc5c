# The C types of tracing/wire.py when tracing.compiled builds it (Cython reads this file beside the
# module's source); as Python, the module ignores it.
cimport cython


cdef class _Message:
    cdef bytes read
    cdef frozenset schema


cdef long long _int32(unsigned long long value)

cdef long long _int64(unsigned long long value)


cdef _Message _REQUEST_FIELDS, _RESOURCE_SPANS_FIELDS, _RESOURCE_FIELDS, _SCOPE_SPANS_FIELDS, _SCOPE_FIELDS
cdef _Message _SPAN_FIELDS, _EVENT_FIELDS, _STATUS_FIELDS, _KEY_VALUE_FIELDS, _ANY_VALUE_FIELDS, _ARRAY_FIELDS
cdef _Message _KV_LIST_FIELDS


cdef class Reader:
    cdef bytes data
    cdef const unsigned char* buf
    cdef Py_ssize_t size, pos, end, cut, limit
    cdef bytes zero_span_id
    cdef object clean, finite, rejection, raw_span, span_event, missing_resource

    @cython.locals(buf="const unsigned char*", pos=Py_ssize_t, result=cython.ulonglong, shift=cython.int, byte=cython.ulonglong)
    cdef unsigned long long varint(self) except? 0xFFFFFFFFFFFFFFFF

    @cython.locals(buf="const unsigned char*", pos=Py_ssize_t, result=cython.ulonglong, index=Py_ssize_t)
    cdef unsigned long long fixed(self, Py_ssize_t size) except? 0xFFFFFFFFFFFFFFFF

    @cython.locals(size=cython.ulonglong, start=Py_ssize_t)
    cdef Py_ssize_t length(self) except -1

    cdef object skip(self, unsigned long long wire_type)

    @cython.locals(key=cython.ulonglong, number=cython.ulonglong, wire_type=cython.ulonglong, read=bytes, expected=cython.uint)
    cdef int tag(self, _Message message) except -1

    @cython.locals(start=Py_ssize_t, end=Py_ssize_t)
    cdef str text(self)

    @cython.locals(start=Py_ssize_t, end=Py_ssize_t)
    cdef bytes raw(self)

    cdef object close(self, Py_ssize_t end)

    @cython.locals(start=Py_ssize_t, end=Py_ssize_t)
    cpdef tuple request(self)

    @cython.locals(number=cython.int, first=Py_ssize_t, last=Py_ssize_t, resource=dict, scopes=list)
    cdef object resource_spans(self, Py_ssize_t start, Py_ssize_t end, list spans, object reasons)

    @cython.locals(number=cython.int, first=Py_ssize_t, attributes=dict)
    cdef dict resource(self, Py_ssize_t start, Py_ssize_t end)

    @cython.locals(number=cython.int, first=Py_ssize_t, last=Py_ssize_t, seen_scope=cython.bint, bodies=list)
    cdef object scope_spans(self, Py_ssize_t start, Py_ssize_t end, dict resource, list spans, object reasons)

    @cython.locals(number=cython.int)
    cdef tuple scope(self, Py_ssize_t start, Py_ssize_t end)

    @cython.locals(
        number=cython.int,
        first=Py_ssize_t,
        trace_id=bytes,
        span_id=bytes,
        parent_id=bytes,
        name=str,
        kind=cython.longlong,
        start_ns=cython.ulonglong,
        end_ns=cython.ulonglong,
        truncated=dict,
        attributes=dict,
        events=list,
        limit=Py_ssize_t,
        status_code=cython.longlong,
        status_message=str,
    )
    cdef object span(self, Py_ssize_t start, Py_ssize_t end, dict resource, str scope_name, str scope_version, object reasons)

    @cython.locals(number=cython.int, first=Py_ssize_t, time_ns=cython.ulonglong, attributes=dict)
    cdef object event(self, Py_ssize_t start, Py_ssize_t end)

    @cython.locals(number=cython.int, code=cython.longlong)
    cdef tuple status(self, Py_ssize_t start, Py_ssize_t end)

    @cython.locals(number=cython.int, first=Py_ssize_t, cut=Py_ssize_t, seen_value=cython.bint, key=str)
    cdef object key_value(self, Py_ssize_t start, Py_ssize_t end, dict into, dict truncated, int depth)

    @cython.locals(number=cython.int, first=Py_ssize_t, seen=cython.bint, cut=Py_ssize_t, limit=Py_ssize_t)
    cdef object any_value(self, Py_ssize_t start, Py_ssize_t end, int depth)

    @cython.locals(first=Py_ssize_t, values=list)
    cdef list array(self, Py_ssize_t start, Py_ssize_t end, int depth)

    @cython.locals(first=Py_ssize_t, values=dict)
    cdef dict kv_list(self, Py_ssize_t start, Py_ssize_t end, int depth)
