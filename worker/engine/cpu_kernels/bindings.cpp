// The Python module: one build of every kernel (see __init__.py).
#include "kernels.h"

// Every kernel lets go of the GIL while it runs (none touches a Python object): the worker's
// event loop routes and publishes on another thread while the engine thread is in them.
using released = py::call_guard<py::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "one-token-per-row attention over a slot cache", released());
  m.def("prefill_attention", &prefill_attention, "flash attention over a chunk of queries", released(),
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask"), py::arg("scale"), py::arg("dots") = true);
  m.def("prefill_supported", &prefill_supported, "whether this build has prefill_attention");
  m.def("rms_norm", &rms_norm, "RMSNorm of each row, of x + residual where given (returned too)", released(),
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"));
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused gate/up product", released());
  m.def("append_and_attend", &append_and_attend,
        "a decode step's rotation, slot writes and attention for one layer", released());
  m.def("rotary", &rotary, "queries and keys rotated by the rotary embedding", released());
}
