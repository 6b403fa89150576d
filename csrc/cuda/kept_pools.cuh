// Bookkeeping shared by the loops that keep CUDA graphs from one call to the next (lstm.cu's
// replayed cuBLAS steps, convlstm.cu's step graphs): a least-recently-used map of kept
// entries, and pools made per thread and device, registered so that a release can reach every
// thread's pools from any thread.
#pragma once

#include <c10/cuda/CUDAGuard.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace seqkernels::cuda {

// map[key] (made if new), marked as the most recent use (`uses` counts them); where the map
// then holds more than `limit` entries, the least recently used other entry goes to drop(entry)
// and is erased. The map's entries carry `uint64_t last_use`.
template <class Map, class Drop>
typename Map::mapped_type& keep_recent(Map& map, const std::string& key, uint64_t& uses, size_t limit, Drop&& drop) {
  auto& entry = map[key];
  entry.last_use = ++uses;
  if (map.size() > limit) {
    auto oldest = map.end();
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (&it->second != &entry && (oldest == map.end() || it->second.last_use < oldest->second.last_use)) {
        oldest = it;
      }
    }
    drop(oldest->second);
    map.erase(oldest);
  }
  return entry;
}

// Every thread's pools of one kind (the pools of threads that have ended too).
template <class Pool>
struct PoolRegistry {
  std::mutex mutex;
  std::vector<Pool*> all;
};

template <class Pool>
PoolRegistry<Pool>& pool_registry() {
  static auto* registry = new PoolRegistry<Pool>();  // never destroyed, like the pools
  return *registry;
}

// The calling thread's pool of this kind on `device`, made by make(device) (a new Pool*) at the
// thread's first use. Never freed, not even when the thread ends (its map only forgets it):
// destroying CUDA graphs at process exit could outlive the CUDA context.
template <class Pool, class Make>
Pool& thread_pool(c10::DeviceIndex device, Make&& make) {
  thread_local std::unordered_map<c10::DeviceIndex, Pool*> pools;
  auto it = pools.find(device);
  if (it == pools.end()) {
    Pool* pool = make(device);
    PoolRegistry<Pool>& registry = pool_registry<Pool>();
    const std::lock_guard<std::mutex> registered(registry.mutex);
    registry.all.push_back(pool);
    it = pools.emplace(device, pool).first;
  }
  return *it->second;
}

// release(pool) for every thread's pool of this kind, each on its device (`device`) and under
// its lock (`mutex`, which a call using the pool holds: a release waits for it to end).
template <class Pool, class Release>
void release_all_pools(Release&& release) {
  PoolRegistry<Pool>& registry = pool_registry<Pool>();
  const std::lock_guard<std::mutex> registered(registry.mutex);
  for (Pool* pool : registry.all) {
    const std::lock_guard<std::mutex> in_use(pool->mutex);
    const c10::cuda::CUDAGuard on_device(pool->device);
    release(*pool);
  }
}

}  // namespace seqkernels::cuda
