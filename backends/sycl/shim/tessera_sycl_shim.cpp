// Tessera SYCL shim: a flat C API over the SYCL runtime (libsycl), built by build.rs with the host
// C++ compiler against the runtime's headers and loaded by the Rust crate at run time. Every entry
// point catches all exceptions: it returns 0 on success, or -1 with the message available from
// tsy_last_error() (per thread).
#include <sycl/sycl.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace syclex = sycl::ext::oneapi::experimental;

namespace {
thread_local std::string g_error;

int fail(const char* where, const std::exception& e) {
    g_error = std::string(where) + ": " + e.what();
    return -1;
}
int fail_msg(const std::string& msg) {
    g_error = msg;
    return -1;
}
} // namespace

#define TSY_TRY(where, body)                                                                      \
    try {                                                                                         \
        body;                                                                                     \
        return 0;                                                                                 \
    } catch (const std::exception& e) {                                                          \
        return fail(where, e);                                                                    \
    } catch (...) {                                                                               \
        return fail_msg(std::string(where) + ": unknown C++ exception");                         \
    }

namespace {
template <size_t N> struct alignas(8) Blob {
    unsigned char b[N];
};
template <size_t N> void set_blob(sycl::handler& h, int i, const void* v) {
    Blob<N> blob;
    std::memcpy(blob.b, v, N);
    h.set_arg(i, blob);
}
} // namespace

struct tsy_device {
    sycl::device dev;
    std::shared_ptr<sycl::context> ctx;
    std::string name;
    int root; // index of the root device, -1 for a root
};

struct tsy_platform {
    std::vector<tsy_device> devices;
};

struct tsy_queue {
    sycl::queue q;
};

struct tsy_event {
    sycl::event e;
};

struct tsy_program {
    sycl::kernel_bundle<sycl::bundle_state::executable> bundle;
};

struct tsy_kernel {
    sycl::kernel k;
};

extern "C" {

const char* tsy_last_error() { return g_error.c_str(); }

// Opens every SYCL device. A root device whose compute units can be split in two is followed
// by its sub-devices (partition_equally); `split` = 0 skips partitioning. Before the runtime
// starts: `cache_dir` (if not null) turns on the runtime's persistent kernel cache there unless
// SYCL_CACHE_PERSISTENT is set, and `icd_file` (if not null) names the OpenCL CPU runtime for the
// ICD loader unless OCL_ICD_VENDORS or OCL_ICD_FILENAMES is set.
int tsy_open(int split, const char* cache_dir, const char* icd_file, tsy_platform** out) {
    TSY_TRY("tsy_open", {
        if (cache_dir != nullptr && std::getenv("SYCL_CACHE_PERSISTENT") == nullptr) {
            setenv("SYCL_CACHE_PERSISTENT", "1", 0);
            setenv("SYCL_CACHE_DIR", cache_dir, 0);
        }
        if (icd_file != nullptr && std::getenv("OCL_ICD_VENDORS") == nullptr &&
            std::getenv("OCL_ICD_FILENAMES") == nullptr) {
            setenv("OCL_ICD_FILENAMES", icd_file, 0);
        }
        auto p = std::make_unique<tsy_platform>();
        int root_count = 0;
        for (const auto& d : sycl::device::get_devices()) {
            std::vector<sycl::device> members{d};
            std::vector<sycl::device> subs;
            unsigned cu = d.get_info<sycl::info::device::max_compute_units>();
            if (split && cu >= 2) {
                auto props = d.get_info<sycl::info::device::partition_properties>();
                bool can = false;
                for (auto pp : props) {
                    can = can || pp == sycl::info::partition_property::partition_equally;
                }
                if (can) {
                    try {
                        subs = d.create_sub_devices<
                            sycl::info::partition_property::partition_equally>(cu / 2);
                    } catch (const sycl::exception&) {
                        subs.clear();
                    }
                }
            }
            members.insert(members.end(), subs.begin(), subs.end());
            auto ctx = std::make_shared<sycl::context>(members);
            int root_index = (int)p->devices.size();
            p->devices.push_back(
                {d, ctx, d.get_info<sycl::info::device::name>(), -1});
            for (auto& s : subs) {
                p->devices.push_back({s, ctx, s.get_info<sycl::info::device::name>(), root_index});
            }
            root_count++;
        }
        (void)root_count;
        *out = p.release();
    })
}

void tsy_close(tsy_platform* p) { delete p; }

int tsy_device_count(const tsy_platform* p) { return (int)p->devices.size(); }

// kind: 0 CPU, 1 GPU, 2 accelerator/other.
int tsy_device_info(const tsy_platform* p, int i, char* name, size_t cap, int* kind, int* root,
                    uint64_t* global_mem, uint32_t* compute_units, uint64_t* max_wg) {
    TSY_TRY("tsy_device_info", {
        const auto& d = p->devices.at((size_t)i);
        std::snprintf(name, cap, "%s", d.name.c_str());
        *kind = d.dev.is_cpu() ? 0 : d.dev.is_gpu() ? 1 : 2;
        *root = d.root;
        *global_mem = d.dev.get_info<sycl::info::device::global_mem_size>();
        *compute_units = d.dev.get_info<sycl::info::device::max_compute_units>();
        *max_wg = d.dev.get_info<sycl::info::device::max_work_group_size>();
    })
}

int tsy_runtime_version(const tsy_platform* p, int i, char* out, size_t cap) {
    TSY_TRY("tsy_runtime_version", {
        const auto& d = p->devices.at((size_t)i);
        std::string v = d.dev.get_platform().get_info<sycl::info::platform::version>() + " / " +
                        d.dev.get_info<sycl::info::device::driver_version>();
        std::snprintf(out, cap, "%s", v.c_str());
    })
}

int tsy_queue_new(const tsy_platform* p, int i, tsy_queue** out) {
    TSY_TRY("tsy_queue_new", {
        const auto& d = p->devices.at((size_t)i);
        *out = new tsy_queue{sycl::queue(*d.ctx, d.dev, sycl::property::queue::in_order())};
    })
}

void tsy_queue_free(tsy_queue* q) {
    if (q == nullptr) {
        return;
    }
    try {
        q->q.wait();
    } catch (...) {
    }
    delete q;
}

int tsy_queue_wait(tsy_queue* q) { TSY_TRY("wait", q->q.wait_and_throw()) }

int tsy_malloc(const tsy_platform* p, int i, size_t size, void** out) {
    TSY_TRY("USM allocation", {
        const auto& d = p->devices.at((size_t)i);
        // CPU devices get host USM: the OpenCL CPU runtime (2026.2) deadlocks on memcpy between
        // device (or shared) allocations of two sub-devices, while host USM copies between them
        // and is just as close to a CPU device's cores.
        size_t bytes = size == 0 ? 1 : size;
        void* ptr = d.dev.is_cpu() ? sycl::malloc_host(bytes, *d.ctx)
                                   : sycl::malloc_device(bytes, d.dev, *d.ctx);
        if (ptr == nullptr) {
            throw std::runtime_error("out of device memory (" + std::to_string(size) + " bytes)");
        }
        *out = ptr;
    })
}

int tsy_free(const tsy_platform* p, int i, void* ptr) {
    TSY_TRY("free", sycl::free(ptr, *p->devices.at((size_t)i).ctx))
}

int tsy_memcpy(tsy_queue* q, void* dst, const void* src, size_t n, int blocking) {
    TSY_TRY("memcpy", {
        auto e = q->q.memcpy(dst, src, n);
        if (blocking) {
            e.wait_and_throw();
        }
    })
}

int tsy_memset(tsy_queue* q, void* dst, int value, size_t n, int blocking) {
    TSY_TRY("memset", {
        auto e = q->q.memset(dst, value, n);
        if (blocking) {
            e.wait_and_throw();
        }
    })
}

int tsy_event_record(tsy_queue* q, tsy_event** out) {
    TSY_TRY("record event", *out = new tsy_event{q->q.ext_oneapi_submit_barrier()})
}

int tsy_queue_wait_event(tsy_queue* q, const tsy_event* e) {
    TSY_TRY("wait event", q->q.ext_oneapi_submit_barrier({e->e}))
}

int tsy_event_wait(const tsy_event* e) {
    TSY_TRY("event wait", const_cast<sycl::event&>(e->e).wait_and_throw())
}

int tsy_event_done(const tsy_event* e, int* done) {
    TSY_TRY("event status", {
        *done = e->e.get_info<sycl::info::event::command_execution_status>() ==
                sycl::info::event_command_status::complete;
    })
}

void tsy_event_free(tsy_event* e) { delete e; }

// Builds SYCL source for every device of device i's context.
int tsy_program_build(const tsy_platform* p, int i, const char* src, tsy_program** out) {
    TSY_TRY("build kernels", {
        const auto& d = p->devices.at((size_t)i);
        auto kb = syclex::create_kernel_bundle_from_source(*d.ctx, syclex::source_language::sycl,
                                                           std::string(src));
        *out = new tsy_program{syclex::build(kb)};
    })
}

void tsy_program_free(tsy_program* prog) { delete prog; }

int tsy_kernel_get(tsy_program* prog, const char* name, tsy_kernel** out) {
    TSY_TRY("get kernel", *out = new tsy_kernel{prog->bundle.ext_oneapi_get_kernel(name)})
}

void tsy_kernel_free(tsy_kernel* k) { delete k; }

// Queues kernel k over grid[0..3] blocks of `block` work-items (CUDA geometry: x fastest).
// Argument i is a device pointer when kinds[i] == 1, else sizes[i] bytes at values[i] (4, 8 or
// 80: the kernels' scalars and `struct Tensor`).
int tsy_launch(tsy_queue* q, const tsy_kernel* k, const uint32_t* grid, uint32_t block, int nargs,
               const int* kinds, const size_t* sizes, const void* const* values) {
    TSY_TRY("launch", {
        for (int i = 0; i < nargs; i++) {
            if (kinds[i] != 1 && sizes[i] != 4 && sizes[i] != 8 && sizes[i] != 80) {
                throw std::invalid_argument("argument " + std::to_string(i) + " has size " +
                                            std::to_string(sizes[i]));
            }
        }
        sycl::range<3> local(1, 1, block);
        sycl::range<3> global((size_t)grid[2], (size_t)grid[1], (size_t)grid[0] * block);
        q->q.submit([&](sycl::handler& h) {
            for (int i = 0; i < nargs; i++) {
                if (kinds[i] == 1) {
                    void* ptr;
                    std::memcpy(&ptr, values[i], sizeof ptr);
                    h.set_arg(i, ptr);
                } else if (sizes[i] == 4) {
                    // Scalars go as same-size integers: only their bytes matter to the runtime.
                    uint32_t v;
                    std::memcpy(&v, values[i], 4);
                    h.set_arg(i, v);
                } else if (sizes[i] == 8) {
                    uint64_t v;
                    std::memcpy(&v, values[i], 8);
                    h.set_arg(i, v);
                } else {
                    set_blob<80>(h, i, values[i]);
                }
            }
            h.parallel_for(sycl::nd_range<3>(global, local), k->k);
        });
    })
}

} // extern "C"
