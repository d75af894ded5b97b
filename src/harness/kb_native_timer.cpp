// krefine's native timing loop for strict mode (kb_native builds, seals and loads it; kb_timing calls it).
//
// Why native: a loop written in Python keeps its state (which call this is, the events, the clock
// readings, the list of times) in frames and objects that the candidate's forward can reach through
// sys._getframe, frame.f_back.f_locals or gc.get_objects, and so read or rewrite what decides its time.
// Here that state lives in this function's C++ locals: while the candidate's forward runs, the only
// Python frames above this loop are forward's own (and nn.Module's call machinery), and the frames
// below it hold nothing the loop decides with. The times come back to Python once, after the last call.
//
// Per timed call, as kb_timing's Python loop did: inputs(call) (the worker's fresh inputs, made outside
// the timed region) -> device-wide sync -> L2 flush -> start event -> fn(*inputs) -> device-wide sync
// -> end event -> sync; then after(call, output, calls) (the worker's check). On the CPU the clock is
// std::chrono::steady_clock (CLOCK_MONOTONIC, time.perf_counter's clock) around fn.
//
// The CUDA driver API is reached through dlopen("libcuda.so.1") at run time, not linked: the module
// then builds with a C++ compiler and Python's headers alone (seconds, no CUDA toolkit or torch
// headers), identically on CPU-only and GPU machines, and works with whichever CUDA runtime torch
// brought. The runtime's stream and primary context are the driver's (CUstream == cudaStream_t).
//
// Hooks: a trace or profile function, a sys.monitoring tool or a gc callback lets candidate code run
// outside forward (in the harness's own calls) and rewrite what they hold. The loop refuses to start
// with one installed, and stops (kind "hook") as soon as one appears. The functions it checks with are
// captured when the module is imported, before any candidate code runs.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

using CUresult = int;
using CUevent = struct CUevent_st*;
using CUstream = struct CUstream_st*;

struct Driver {
    CUresult (*event_create)(CUevent*, unsigned int) = nullptr;
    CUresult (*event_record)(CUevent, CUstream) = nullptr;
    CUresult (*event_elapsed)(float*, CUevent, CUevent) = nullptr;
    CUresult (*event_destroy)(CUevent) = nullptr;
    CUresult (*ctx_synchronize)() = nullptr;
};

// Captured at import (module doc): sys.gettrace, sys.getprofile, sys.monitoring.get_tool (3.12+), the
// gc module's callbacks list.
PyObject* g_gettrace = nullptr;
PyObject* g_getprofile = nullptr;
PyObject* g_get_tool = nullptr;
PyObject* g_gc_callbacks = nullptr;

template <typename F>
bool bind(void* lib, const char* name, F& slot) {
    slot = reinterpret_cast<F>(dlsym(lib, name));
    return slot != nullptr;
}

// The driver's entry points, or an error message.
std::string load_driver(Driver& d) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == nullptr) return std::string("cannot open libcuda.so.1: ") + dlerror();
    if (!bind(lib, "cuEventCreate", d.event_create) || !bind(lib, "cuEventRecord", d.event_record) ||
        !bind(lib, "cuEventElapsedTime", d.event_elapsed) || !bind(lib, "cuEventDestroy_v2", d.event_destroy) ||
        !bind(lib, "cuCtxSynchronize", d.ctx_synchronize)) {
        return "libcuda.so.1 lacks an event or synchronize entry point";
    }
    return "";
}

// Empty when no hook is installed; else what is.
std::string installed_hook() {
    PyObject* getters[2] = {g_gettrace, g_getprofile};
    const char* names[2] = {"a trace function (sys.settrace)", "a profile function (sys.setprofile)"};
    for (int i = 0; i < 2; ++i) {
        PyObject* hook = PyObject_CallNoArgs(getters[i]);
        if (hook == nullptr) {
            PyErr_Clear();
            return std::string("cannot read ") + names[i];
        }
        bool set = hook != Py_None;
        Py_DECREF(hook);
        if (set) return names[i];
    }
    if (g_get_tool != nullptr) {
        for (int tool = 0; tool < 6; ++tool) {
            PyObject* name = PyObject_CallFunction(g_get_tool, "i", tool);
            if (name == nullptr) {
                PyErr_Clear();
                return "cannot read sys.monitoring's tools";
            }
            bool set = name != Py_None;
            Py_DECREF(name);
            if (set) return "a sys.monitoring tool";
        }
    }
    if (g_gc_callbacks != nullptr && PyList_Check(g_gc_callbacks) && PyList_GET_SIZE(g_gc_callbacks) > 0) {
        return "a gc callback (gc.callbacks)";
    }
    return "";
}

// The loop ended early at `call` (1-based; 0: before the first): no times, why.
PyObject* stop(long call, const char* kind, const std::string& message) {
    return Py_BuildValue("(()(lss))", call, kind, message.c_str());
}

PyObject* result(const std::vector<double>& times) {
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(times.size()));
    if (tuple == nullptr) return nullptr;
    for (size_t i = 0; i < times.size(); ++i) {
        PyObject* value = PyFloat_FromDouble(times[i]);
        if (value == nullptr) {
            Py_DECREF(tuple);
            return nullptr;
        }
        PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), value);
    }
    PyObject* out = Py_BuildValue("(OO)", tuple, Py_None);
    Py_DECREF(tuple);
    return out;
}

// Owns the two events of a CUDA run.
struct Events {
    Driver* d = nullptr;
    CUevent start = nullptr;
    CUevent end = nullptr;
    ~Events() {
        if (d != nullptr && start != nullptr) d->event_destroy(start);
        if (d != nullptr && end != nullptr) d->event_destroy(end);
    }
};

PyObject* cuda_error(const char* what, CUresult code) {
    PyErr_Format(PyExc_RuntimeError, "native timer: %s failed (CUDA driver error %d)", what, code);
    return nullptr;
}

// run(fn, inputs, after, calls, discard, stream, flush) -> (times, stop)
//   fn: the candidate (or reference) model; inputs(call) -> its arguments for timed call `call`;
//   after(call, output, calls) -> a problem or None (None: nothing to check); stream: the CUDA stream as
//   an int, or None for the host clock; flush() clears L2 before each timed call (None: no flush).
//   times: the timed calls' milliseconds from call `discard` on; stop: None, or (call, kind, message)
//   with kind "mismatch" (after() returned a problem) or "hook" (module doc), the loop ended there.
PyObject* run(PyObject*, PyObject* args) {
    PyObject *fn, *inputs, *after, *stream_obj, *flush;
    long calls, discard;
    if (!PyArg_ParseTuple(args, "OOOllOO", &fn, &inputs, &after, &calls, &discard, &stream_obj, &flush)) {
        return nullptr;
    }
    if (!PyCallable_Check(fn) || !PyCallable_Check(inputs)) {
        PyErr_SetString(PyExc_TypeError, "native timer: fn and inputs must be callable");
        return nullptr;
    }
    if (calls < 0 || discard < 0) {
        PyErr_SetString(PyExc_ValueError, "native timer: calls and discard must not be negative");
        return nullptr;
    }
    bool cuda = stream_obj != Py_None;
    Driver driver;
    Events events;
    CUstream stream = nullptr;
    if (cuda) {
        stream = reinterpret_cast<CUstream>(PyLong_AsVoidPtr(stream_obj));
        if (PyErr_Occurred()) return nullptr;
        std::string problem = load_driver(driver);
        if (!problem.empty()) {
            PyErr_Format(PyExc_RuntimeError, "native timer: %s", problem.c_str());
            return nullptr;
        }
        events.d = &driver;
        CUresult code = driver.event_create(&events.start, 0);
        if (code == 0) code = driver.event_create(&events.end, 0);
        if (code != 0) return cuda_error("cuEventCreate", code);
    }
    std::vector<double> times;
    times.reserve(static_cast<size_t>(calls > discard ? calls - discard : 0));
    std::string hook = installed_hook();
    if (!hook.empty()) return stop(0, "hook", hook + " was installed before timing");
    for (long call = 0; call < calls; ++call) {
        PyObject* raw = PyObject_CallFunction(inputs, "l", call);
        if (raw == nullptr) return nullptr;
        PyObject* call_args = PySequence_Tuple(raw);
        Py_DECREF(raw);
        if (call_args == nullptr) return nullptr;
        PyObject* output = nullptr;
        double elapsed = 0.0;
        if (cuda) {
            CUresult code = driver.ctx_synchronize();
            if (code == 0 && flush != Py_None) {
                PyObject* flushed = PyObject_CallNoArgs(flush);
                if (flushed == nullptr) {
                    Py_DECREF(call_args);
                    return nullptr;
                }
                Py_DECREF(flushed);
            }
            if (code == 0) code = driver.event_record(events.start, stream);
            if (code != 0) {
                Py_DECREF(call_args);
                return cuda_error("cuCtxSynchronize/cuEventRecord", code);
            }
            output = PyObject_Call(fn, call_args, nullptr);
            if (output != nullptr) {
                code = driver.ctx_synchronize();  // device-wide: side streams are inside the fence
                if (code == 0) code = driver.event_record(events.end, stream);
                if (code == 0) code = driver.ctx_synchronize();
                float ms = 0.0f;
                if (code == 0) code = driver.event_elapsed(&ms, events.start, events.end);
                if (code != 0) {
                    Py_DECREF(output);
                    Py_DECREF(call_args);
                    return cuda_error("timing a call", code);
                }
                elapsed = static_cast<double>(ms);
            }
        } else {
            auto started = std::chrono::steady_clock::now();
            output = PyObject_Call(fn, call_args, nullptr);
            auto ended = std::chrono::steady_clock::now();
            elapsed = std::chrono::duration<double, std::milli>(ended - started).count();
        }
        Py_DECREF(call_args);
        if (output == nullptr) return nullptr;
        hook = installed_hook();
        if (!hook.empty()) {
            Py_DECREF(output);
            return stop(call + 1, "hook", hook + " was installed during timed call " + std::to_string(call + 1));
        }
        if (after != Py_None) {
            PyObject* problem = PyObject_CallFunction(after, "lOl", call, output, calls);
            Py_DECREF(output);
            output = nullptr;
            if (problem == nullptr) return nullptr;
            if (problem != Py_None) {
                PyObject* text = PyObject_Str(problem);
                Py_DECREF(problem);
                if (text == nullptr) return nullptr;
                const char* utf8 = PyUnicode_AsUTF8(text);
                std::string message = utf8 != nullptr ? utf8 : "the output does not match";
                Py_DECREF(text);
                PyErr_Clear();
                return stop(call + 1, "mismatch", message);
            }
            Py_DECREF(problem);
        } else {
            Py_DECREF(output);
        }
        // Outputs and inputs are released: a finaliser of the candidate's could have run just now.
        hook = installed_hook();
        if (!hook.empty()) {
            return stop(call + 1, "hook", hook + " was installed after timed call " + std::to_string(call + 1));
        }
        if (call >= discard) times.push_back(elapsed);
    }
    return result(times);
}

PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "run(fn, inputs, after, calls, discard, stream, flush) -> (times, stop)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kb_native_timer", "krefine's native timing loop for strict mode.", -1, methods,
    nullptr, nullptr, nullptr, nullptr,
};

PyObject* attribute(const char* module_name, const char* name) {
    PyObject* owner = PyImport_ImportModule(module_name);
    if (owner == nullptr) return nullptr;
    PyObject* value = PyObject_GetAttrString(owner, name);
    Py_DECREF(owner);
    return value;
}

}  // namespace

PyMODINIT_FUNC PyInit_kb_native_timer() {
    g_gettrace = attribute("sys", "gettrace");
    g_getprofile = attribute("sys", "getprofile");
    g_gc_callbacks = attribute("gc", "callbacks");
    if (g_gettrace == nullptr || g_getprofile == nullptr || g_gc_callbacks == nullptr) return nullptr;
    PyObject* monitoring = attribute("sys", "monitoring");
    if (monitoring != nullptr) {
        g_get_tool = PyObject_GetAttrString(monitoring, "get_tool");
        Py_DECREF(monitoring);
    }
    PyErr_Clear();  // before 3.12 there is no sys.monitoring
    return PyModule_Create(&module);
}
