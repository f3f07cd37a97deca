# ---
# jupyter:
#   jupytext:
#     comment_magics: false
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # GPU memory: allocated, reserved, and what `nvidia-smi` shows
#
# PyTorch does not give freed GPU memory back to the driver. Its **caching allocator** keeps the blocks it got from `cudaMalloc` and reuses them for the next tensors of a similar size, because asking the driver is slow. So there are two numbers:
#
# - **allocated** (`torch.cuda.memory_allocated()`): bytes in live tensors — what your code holds;
# - **reserved** (`torch.cuda.memory_reserved()`): allocated plus the cached free blocks — what `nvidia-smi` shows for the process (plus the CUDA context's few hundred MiB), and what other processes cannot use.
#
# A leak grows *allocated*. Reserved growing while allocated stays flat is the cache (or fragmentation), not a leak — the most common false alarm. `%%memwatch` draws both curves and tells them apart.
#
# **No GPU?** Every cell below runs on the CPU too, where the C heap tells the same story: glibc's `malloc` also keeps freed memory for reuse. **heap in use** (what live objects hold, read with glibc's `mallinfo2`) plays *allocated*; the process's **RSS** (what `top` and the OOM killer see) plays *reserved*. Where a GPU is present the cells use it, and the text says what each shows.

# %%
%load_ext torchmem_magic
import ctypes, os
import psutil, torch, torchmem_magic
torch.manual_seed(0)
torch.set_num_threads(1)
cuda = torch.cuda.is_available()
device = torch.device('cuda' if cuda else 'cpu')

class Mallinfo2(ctypes.Structure):  # glibc's heap statistics, what the heap curve reads
    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2

def memory():
    """(in live tensors, held by the process): allocated/reserved on a GPU, heap in use/RSS on a CPU."""
    if cuda:
        return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd, psutil.Process().memory_info().rss

def show(when):
    used, held = memory()
    names = ('allocated', 'reserved') if cuda else ('heap in use', 'RSS')
    print(f"{when:28} {names[0]} {used / 2**20:7.1f} MiB · {names[1]} {held / 2**20:7.1f} MiB")

print('watching', torch.cuda.get_device_name() if cuda else 'the CPU heap (no GPU here)')

# %% [markdown]
# ## 1. Freed is not given back
# Allocate 3,000 tensors of 64 KiB (about 190 MiB), each next to a tiny tensor that stays alive — a per-chunk statistic, say — then free the big ones.

# %%
show('before')
chunks, stats = [], []
for i in range(3000):
    chunks.append(torch.ones(16 * 1024, device=device))  # 64 KiB
    stats.append(chunks[-1].sum())                       # a few bytes, kept
show('3,000 chunks alive')
del chunks
show('chunks freed')

# %% [markdown]
# The first number drops back at once; the second does not. On a GPU the freed 190 MiB are cached blocks, still *reserved*: `nvidia-smi` shows the process as big as at its peak. On the CPU, glibc keeps the freed pages in its heap and RSS stays high.
#
# Giving them back is the job of `torch.cuda.empty_cache()` on a GPU, and of glibc's `malloc_trim(0)` on the CPU: `torchmem_magic.collect_garbage()` runs `gc.collect()` and `empty_cache()`, `torchmem_magic.return_heap_to_os()` runs `malloc_trim` (they are the **gc + empty_cache** and **return heap to OS** buttons under the live figure). Each says what it gave back:

# %%
print(torchmem_magic.collect_garbage() if cuda else torchmem_magic.return_heap_to_os())
show('after giving back')

# %% [markdown]
# Here the two allocators differ. glibc returns every free *page*, even between the tiny tensors still alive: RSS drops by almost all of the 190 MiB. The CUDA caching allocator can only release a whole *segment* (a `cudaMalloc`'d block of 2 MiB or more) with nothing alive in it, and nearly every segment here still holds one of the tiny `stats` tensors: on a GPU `empty_cache()` gives back little, and reserved stays high until `stats` goes too. That is **fragmentation**: memory that is free but cannot be used for a bigger tensor or given back because small live blocks are scattered through it.

# %%
del stats
print(torchmem_magic.collect_garbage() if cuda else torchmem_magic.return_heap_to_os())
show('stats freed too')

# %% [markdown]
# ## 2. What `%%memwatch` makes of it
# A training loop whose evaluation batches get longer as it goes, as with variable-length sequences: every 40 steps it evaluates a batch longer than any before, in 64 KiB chunks, and keeps a small tensor of statistics — the same pattern, inside a run. Is it a leak?

# %%
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

def evaluate_long_batch(n_chunks):
    with torch.no_grad():
        features = [torch.ones(64, 256, device=device) for _ in range(n_chunks)]  # 64 KiB each
        return torch.stack([f.mean() for f in features])  # the features go; 12 KiB of statistics stay


# %%
%%memwatch
for step in range(400):
    x, y = torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 40 == 39:  # a batch longer than any before: 19 MiB more each time
        chunk_means = evaluate_long_batch(n_chunks=300 * (step // 40 + 1))

# %% [markdown]
# **heap in use** (on a GPU: **CUDA allocated**) jumps at each evaluation (where a sample falls inside one) and falls straight back: the features are freed when `evaluate_long_batch` returns. **RAM** (on a GPU: **CUDA reserved**) climbs a step with each new longest batch and never comes down: the allocator needed room for the biggest batch so far, and keeps it. The verdict is **clean**: what decides is what live objects hold, and that did not grow. On a GPU the report adds that reserved memory growing while allocated is flat is the caching allocator, with `torch.cuda.empty_cache()` and `expandable_segments` as the remedies; on the CPU it adds that *RSS grows while the heap in use is flat: not memory your objects hold, but freed memory the allocator keeps (fragmentation)…*, and that `malloc_trim(0)` (the **return heap to OS** button) gives it back.

# %%
run = torchmem_magic.last_report().to_dict()
print('verdict:', run['verdict'])
mib = lambda n: f"{n / 2**20:.1f} MiB"
if cuda:
    vram = run['vram']
    print(f"CUDA allocated: start {mib(vram['allocated_start'])}, peak {mib(vram['allocated_peak'])}, "
          f"end {mib(vram['allocated_end'])} · reserved at the end {mib(vram['reserved_end'])}")
else:
    for name, label in (('heap', 'heap in use'), ('ram', 'RAM')):
        r = run[name]
        print(f"{label:12} start {mib(r['start'])}, peak {mib(r['peak'])}, end {mib(r['end'])}")

# %% [markdown]
# Not a leak — but memory the process holds that nothing uses. When another process needs it (or before handing the GPU over), give it back, and RAM (on a GPU: reserved) comes down to what is in use:

# %%
given_back = torchmem_magic.collect_garbage() if cuda else torchmem_magic.return_heap_to_os()
print(given_back)

# %% [markdown]
# ## 3. Fragmentation: `expandable_segments` and `max_split_size_mb`
# The caching allocator is configured by the environment variable `PYTORCH_CUDA_ALLOC_CONF`, read once, when CUDA makes its first allocation — set it in the shell that starts Jupyter, or in the notebook's first cell *before* anything touches the GPU (then restart the kernel):
#
# - **`expandable_segments:True`** — segments grow in place (virtual memory mapped as needed) instead of being fixed-size `cudaMalloc` blocks. Tensors of varying sizes (variable sequence lengths, growing batch sizes) then leave far fewer unusable holes, and `empty_cache()` can unmap a segment's free pages. The first thing to try when reserved keeps creeping or an OOM message says *reserved but unallocated* is large.
# - **`max_split_size_mb:N`** — blocks larger than N MiB are never split to serve smaller requests, so big blocks stay available for big tensors. An older remedy for the same OOM; `expandable_segments` usually works better.
# - `garbage_collection_threshold:0.8` — reclaim cached blocks once reserved passes 80% of the GPU.
#
# The allocator's own view of fragmentation is `torch.cuda.memory_stats()`: `inactive_split_bytes` are free pieces of split blocks, unusable for anything bigger.

# %%
print('PYTORCH_CUDA_ALLOC_CONF =', os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(not set: the defaults)'))
if cuda:
    stats = torch.cuda.memory_stats()
    print(f"reserved {stats['reserved_bytes.all.current'] / 2**20:.1f} MiB, "
          f"allocated {stats['allocated_bytes.all.current'] / 2**20:.1f} MiB, "
          f"free pieces of split blocks {stats['inactive_split_bytes.all.current'] / 2**20:.1f} MiB")
else:
    info = libc.mallinfo2()
    print(f"no GPU: glibc's heap holds {info.fordblks / 2**20:.1f} MiB free in {info.ordblks:,} free chunks "
          f"(its own fragmentation), {info.keepcost / 2**20:.1f} MiB of it at the top, releasable at once")

# %% [markdown]
# ## What to remember
# - Judge a leak by **allocated** (on the CPU: **heap in use**), not by `nvidia-smi` or RSS.
# - A plateau of reserved memory after a peak is the cache: `torch.cuda.empty_cache()` hands it back (useful before handing the GPU to another process; it does not make your own training use less).
# - Reserved far above allocated, growing, or OOMs that mention *reserved but unallocated*: fragmentation — try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
