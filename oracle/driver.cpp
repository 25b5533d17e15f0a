// The oracle's driver: replays a request sequence through PyTorch's own CUDACachingAllocator (libc10_cuda.so of
// a torch wheel) over the stand-in CUDA runtime (standin/cudart.c), and prints what PyTorch did. See
// oracle/README.md for the request format and the output.
//
// Built by oracle/build against the wheel's headers. The allocator's C++ API moves between releases: the calls
// that differ are chosen by what the header declares (record_history's overloads, __has_include), so one source
// builds for 2.5.1, 2.8.0 and 2.15.0.
//
// stdin: one request per line (blank lines and `#` comments skipped):
//   alloc ID BYTES [STREAM [DEVICE]]  a tensor's storage (Allocator::allocate) on stream STREAM (0: the default
//                                     stream; k > 0: the k-th side stream) of device DEVICE (default 0)
//   free ID                           the storage is released (its DataPtr destroyed); nothing if ID's
//                                     allocation ran out of memory (the record says "skipped")
//   record ID STREAM                  Tensor.record_stream: the storage is used on STREAM too (recordStream)
//   complete                          the GPU finishes its queued work: every recorded event completes
//   empty_cache                       torch.cuda.empty_cache()
//   fraction F [DEVICE]               torch.cuda.set_per_process_memory_fraction(F, DEVICE)
// stdout: one JSON object per request, in order:
//   {"i":N,"op":"alloc","id":ID,"addr":A,"reserved":R,"allocated":X}   (the device's stats after the request)
//   {"i":N,"op":"alloc","id":ID,"oom":"PyTorch's message","reserved":R,"allocated":X}
//   {"i":N,"op":"free"|"record"|"complete"|"empty_cache"|"fraction",...,"reserved":R,"allocated":X}
// and last {"snapshot": {...}}: PyTorch's snapshot() (segments, blocks, device traces) in the layout of
// torch.cuda.memory._snapshot() (oracle/run turns it into a `_dump_snapshot` pickle).
// Exit code 2 with a message naming the line on bad input; PyTorch's own errors other than out of memory
// are reported the same way.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#if __has_include(<c10/cuda/PeerToPeerAccess.h>)
#include <c10/cuda/PeerToPeerAccess.h>
#define GPUHEAP_HAS_P2P_CACHE 1
#endif

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace alloc = c10::cuda::CUDACachingAllocator;

extern "C" int gpuheap_standin_complete_events(void);

// libtorch_cuda registers this hook (is there a primary context on a device?); c10's device guards ask it
// (MaybeSetDevice), and its default throws. libc10_cuda.so exports the setter without declaring it in a header.
namespace c10::cuda::_internal {
C10_CUDA_API void setHasPrimaryContext(bool (*func)(c10::DeviceIndex));
}

static std::string json_str(const std::string& s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
            o += static_cast<char>(c);
        } else if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else {
            o += static_cast<char>(c);
        }
    }
    return o + "\"";
}

[[noreturn]] static void bad(long line, const std::string& what) {
    std::fprintf(stderr, "oracle driver: line %ld: %s\n", line, what.c_str());
    std::exit(2);
}

static const char* action_name(int a) {
    using T = alloc::TraceEntry;
    switch (a) {
    case T::ALLOC: return "alloc";
    case T::FREE_REQUESTED: return "free_requested";
    case T::FREE_COMPLETED: return "free_completed";
    case T::SEGMENT_ALLOC: return "segment_alloc";
    case T::SEGMENT_FREE: return "segment_free";
    case T::SEGMENT_MAP: return "segment_map";
    case T::SEGMENT_UNMAP: return "segment_unmap";
    case T::SNAPSHOT: return "snapshot";
    case T::OOM: return "oom";
    default: return "user_defined";
    }
}

// The current device, set in the runtime directly.
static void set_device(int dev) {
    if (cudaSetDevice(dev) != cudaSuccess) bad(0, "cudaSetDevice failed");
}

// recordHistory(enabled, context_recorder, max_entries, when, [clearHistory (>= 2.6), [skip_actions (>= 2.10)]]):
// the first overload that compiles against this wheel's header is taken.
template <class A, class F>
auto record_history(A* a, F f, long) -> decltype(a->recordHistory(true, f, 1, alloc::RecordContext::ALL, false)) {
    return a->recordHistory(true, f, 1 << 30, alloc::RecordContext::ALL, false);
}
template <class A, class F>
auto record_history(A* a, F f, int)
    -> decltype(a->recordHistory(true, f, 1, alloc::RecordContext::ALL, false, std::vector<std::string>{})) {
    return a->recordHistory(true, f, 1 << 30, alloc::RecordContext::ALL, false, std::vector<std::string>{});
}
template <class A, class F>
auto record_history(A* a, F f, ...) -> decltype(a->recordHistory(true, f, 1, alloc::RecordContext::ALL)) {
    return a->recordHistory(true, f, 1 << 30, alloc::RecordContext::ALL);
}

int main() {
    // Every stand-in device has its context from the start.
    c10::cuda::_internal::setHasPrimaryContext([](c10::DeviceIndex) { return true; });
    auto* a = alloc::get();
    int ndev = c10::cuda::device_count();
#ifdef GPUHEAP_HAS_P2P_CACHE
    // libtorch_cuda's initialisation does this; expandable segments ask it (get_fabric_access, 2.15).
    c10::cuda::detail::init_p2p_access_cache(ndev);
#endif
    a->init(ndev);
    auto no_context = []() -> std::shared_ptr<c10::GatheredContext> { return nullptr; };
    record_history(a, no_context, 0);
    // Side streams, created on demand per (device, index).
    std::map<std::pair<int, long>, c10::cuda::CUDAStream> streams;
    auto stream = [&](long idx, int dev) -> c10::cuda::CUDAStream {
        if (idx == 0) return c10::cuda::getDefaultCUDAStream(static_cast<c10::DeviceIndex>(dev));
        auto k = std::make_pair(dev, idx);
        auto it = streams.find(k);
        if (it != streams.end()) return it->second;
        set_device(dev);
        cudaStream_t s;
        if (cudaStreamCreate(&s) != cudaSuccess) bad(0, "cudaStreamCreate failed");
        auto cs = c10::cuda::getStreamFromExternal(s, static_cast<c10::DeviceIndex>(dev));
        streams.emplace(k, cs);
        return cs;
    };
    std::unordered_map<long, std::pair<c10::DataPtr, int>> live;
    // Ids whose allocation ran out of memory: their `free` (and `record`) does nothing, as the tensor never was.
    std::unordered_map<long, int> failed;
    std::string text;
    long lineno = 0, i = 0;
    int last_dev = 0;
    auto stats = [&](int dev) {
        auto s = a->getDeviceStats(static_cast<c10::DeviceIndex>(dev));
        std::ostringstream o;
        o << ",\"device\":" << dev << ",\"reserved\":" << s.reserved_bytes[0].current
          << ",\"allocated\":" << s.allocated_bytes[0].current << "}";
        return o.str();
    };
    while (std::getline(std::cin, text)) {
        lineno++;
        std::istringstream in(text);
        std::string op;
        if (!(in >> op) || op[0] == '#') continue;
        std::ostringstream out;
        out << "{\"i\":" << i++ << ",\"op\":\"" << op << "\"";
        if (op == "alloc") {
            long id, s = 0;
            unsigned long long bytes;
            int dev = 0;
            if (!(in >> id >> bytes)) bad(lineno, "alloc needs ID BYTES");
            in >> s >> dev;
            if (dev < 0 || dev >= ndev) bad(lineno, "device " + std::to_string(dev) + " not in 0.." + std::to_string(ndev - 1));
            if (live.count(id)) bad(lineno, "id " + std::to_string(id) + " is already live");
            last_dev = dev;
            set_device(dev);
            c10::cuda::setCurrentCUDAStream(stream(s, dev));
            out << ",\"id\":" << id;
            try {
                c10::DataPtr p = a->allocate(bytes);
                out << ",\"addr\":" << reinterpret_cast<uintptr_t>(p.get());
                live.emplace(id, std::make_pair(std::move(p), dev));
            } catch (const c10::OutOfMemoryError& e) {
                out << ",\"oom\":" << json_str(e.what_without_backtrace());
                failed[id] = dev;
            }
        } else if (op == "free") {
            long id;
            if (!(in >> id)) bad(lineno, "free needs ID");
            auto it = live.find(id);
            if (it == live.end() && failed.erase(id)) {
                std::cout << out.str() << ",\"id\":" << id << ",\"skipped\":true" << stats(last_dev) << "\n";
                continue;
            }
            if (it == live.end()) bad(lineno, "id " + std::to_string(id) + " is not live");
            last_dev = it->second.second;
            set_device(last_dev);
            live.erase(it);
            out << ",\"id\":" << id;
        } else if (op == "record") {
            long id, s;
            if (!(in >> id >> s)) bad(lineno, "record needs ID STREAM");
            auto it = live.find(id);
            if (it == live.end() && failed.count(id)) {
                std::cout << out.str() << ",\"id\":" << id << ",\"skipped\":true" << stats(last_dev) << "\n";
                continue;
            }
            if (it == live.end()) bad(lineno, "id " + std::to_string(id) + " is not live");
            last_dev = it->second.second;
            a->recordStream(it->second.first, stream(s, last_dev));
            out << ",\"id\":" << id;
        } else if (op == "complete") {
            out << ",\"events\":" << gpuheap_standin_complete_events();
        } else if (op == "empty_cache") {
            a->emptyCache();
        } else if (op == "fraction") {
            double f;
            int dev = 0;
            if (!(in >> f)) bad(lineno, "fraction needs F");
            in >> dev;
            last_dev = dev;
            a->setMemoryFraction(f, static_cast<c10::DeviceIndex>(dev));
        } else {
            bad(lineno, "unknown request `" + op + "`");
        }
        std::cout << out.str() << stats(last_dev) << "\n";
    }
    // PyTorch's snapshot, in the layout of torch.cuda.memory._snapshot().
    auto snap = a->snapshot();
    std::ostringstream o;
    o << "{\"snapshot\":{\"segments\":[";
    bool first = true;
    for (auto& seg : snap.segments) {
        o << (first ? "" : ",") << "{\"device\":" << int(seg.device) << ",\"address\":" << seg.address
          << ",\"total_size\":" << seg.total_size << ",\"allocated_size\":" << seg.allocated_size
          << ",\"active_size\":" << seg.active_size << ",\"requested_size\":" << seg.requested_size
          << ",\"stream\":" << reinterpret_cast<uintptr_t>(seg.stream) << ",\"segment_type\":\""
          << (seg.is_large ? "large" : "small") << "\",\"segment_pool_id\":[" << seg.owner_private_pool_id.first << ","
          << seg.owner_private_pool_id.second << "],\"is_expandable\":" << (seg.is_expandable ? "true" : "false")
          << ",\"frames\":[],\"blocks\":[";
        first = false;
        size_t addr = seg.address;
        bool fb = true;
        for (auto& b : seg.blocks) {
            const char* state = b.allocated ? "active_allocated" : (b.active ? "active_pending_free" : "inactive");
            o << (fb ? "" : ",") << "{\"address\":" << addr << ",\"size\":" << b.size << ",\"requested_size\":"
              << b.requested_size << ",\"state\":\"" << state << "\",\"frames\":[]}";
            fb = false;
            addr += b.size;
        }
        o << "]}";
    }
    o << "],\"device_traces\":[";
    for (size_t d = 0; d < snap.device_traces.size(); d++) {
        o << (d ? "," : "") << "[";
        bool ft = true;
        for (auto& t : snap.device_traces[d]) {
            // As torch/csrc/cuda/Module.cpp writes it: an `oom` entry's addr_ is the driver's free bytes.
            o << (ft ? "" : ",") << "{\"action\":\"" << action_name(t.action_) << "\",\""
              << (t.action_ == alloc::TraceEntry::OOM ? "device_free" : "addr") << "\":" << t.addr_
              << ",\"size\":" << t.size_ << ",\"stream\":" << reinterpret_cast<uintptr_t>(t.stream_)
              << ",\"time_us\":0,\"frames\":[]}";
            ft = false;
        }
        o << "]";
    }
    o << "]}}";
    std::cout << o.str() << "\n";
    live.clear();
    return 0;
}
