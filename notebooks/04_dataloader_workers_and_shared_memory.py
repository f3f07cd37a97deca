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
# # DataLoader workers and shared memory
#
# A `DataLoader` with `num_workers > 0` forks worker processes. Two things about them fill up memory in ways the training loop never shows:
#
# 1. **Copy-on-access.** A forked worker shares the dataset's pages with the kernel until it *touches* them, and with Python objects reading is touching: every access writes the object's reference count. A dataset held as a list of Python strings, dicts or lists is copied into every worker page by page as the workers read it (pytorch/pytorch#13246). RSS cannot see it (a shared page and its copy both count); PSS, which splits shared pages between the processes sharing them, can.
# 2. **Shared memory.** Every batch a worker produces travels to the main process through `/dev/shm`. In a container that is 64 MB unless you ask for more, and a worker that writes into a full `/dev/shm` is killed by a bus error.
#
# `%%memwatch` follows the workers (by PSS), `/dev/shm` and how each worker ended. This notebook makes each problem, watches it, names it and fixes it.

# %%
%load_ext torchmem_magic
import os, time
import numpy as np
import torch, torchmem_magic
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)
torch.set_num_threads(1)  # the workers need the cores more than this tiny model

# %% [markdown]
# ## 1. Copy-on-access: a dataset of Python objects
# A million records, each a Python string, read by two workers for two epochs. The model is deliberately tiny: all the memory here is the dataset's.

# %%
records = [f"sample-{i:08d}-{'x' * 40}" for i in range(1_000_000)]  # ~90 MiB of Python strings

class Records(Dataset):
    def __init__(self, data):
        self.data = data
    def __len__(self):
        return len(self.data)
    def __getitem__(self, i):
        return len(self.data[i])  # reading the record is enough to copy its page into the worker

model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def train(dataset, epochs=2):
    loader = DataLoader(dataset, batch_size=2048, shuffle=True, num_workers=2, persistent_workers=True)
    for epoch in range(epochs):
        for batch in loader:
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()


# %%
%%memwatch
train(Records(records))

# %% [markdown]
# In the figure, the **workers** curve (their PSS) climbs through the first epoch while the kernel's **heap in use** stays flat: nothing in the training loop allocates, the workers are copying the dataset. The report's advice says where it goes: *DataLoader workers' memory grew by … (by PSS) while the kernel's heap stayed nearly flat: workers copying a dataset of Python objects page by page as they read it (copy-on-access) …*, with the fix, and where the workers will level off. The verdict line itself depends on timing: a leak of the process tree's RAM if the workers were still copying when the cell ended (the OOM killer counts their memory as the job's), `clean` if the copying had stopped — copy-on-access ends once each worker has touched every record. It is a problem of size, not of endless growth: with two workers the dataset ends up in memory three times; with eight, nine. The figures for each worker are in the report object:

# %%
objects = torchmem_magic.last_report()
for worker in objects.workers.per_worker:
    print(f"worker {worker['pid']}: PSS peak {worker['pss_peak'] / 2**20:.0f} MiB")
print(next(line for line in objects.advice if 'copy-on-access' in line))

# %% [markdown]
# ### The fix: the same data as one array
# A numpy array of fixed-width bytes is a single object: reading an element touches no reference count in the shared pages, so nothing is copied. (For variable-length text, `np.frombuffer` over one bytes blob plus an offsets array, or pyarrow, do the same.) Same records, same loop:

# %%
array = np.array(records, dtype='S56')  # 56 MiB in one buffer
del records

# %%
%%memwatch
train(Records(array))

# %%
arrays = torchmem_magic.last_report()
for name, report in (("list of str", objects), ("numpy array", arrays)):
    peak = max(w['pss_peak'] for w in report.workers.per_worker) / 2**20
    flagged = any('copy-on-access' in line for line in report.advice)
    print(f"{name:12} worker PSS peak {peak:4.0f} MiB · copy-on-access flagged: {flagged}")

# %% [markdown]
# The workers stay small and the advice is gone.
#
# ## 2. How batches reach the kernel: sharing strategies and `/dev/shm`
# A worker puts each batch's tensors in shared memory and sends the kernel a handle. torch has two ways to do it:
#
# - **`file_descriptor`** (the default on Linux): a segment is created in `/dev/shm` and unlinked at once; the handle is an open file descriptor. `ls /dev/shm` shows nothing, only the mount's used space (`df /dev/shm`) does — and every batch in flight holds a descriptor, so many workers with big prefetch queues can hit `ulimit -n` (*received 0 items of ancdata*).
# - **`file_system`**: segments are named files `/dev/shm/torch_*`, found by name, and a `torch_shm_manager` process cleans them up. No descriptors, but files that outlive a crash.
#
# `torchmem_magic.sharing_info()` tells you the current strategy, how big `/dev/shm` is and how many descriptors are open, and recommends a change when one is needed (it is the *sharing strategy* panel under the live figure):

# %%
print(torchmem_magic.sharing_info(workers=2))


# %% [markdown]
# Here is what each strategy leaves in `/dev/shm` while batches are in flight: a loader of 1 MiB samples, four to a batch, with four batches held by the loop (and a few more prefetched by the workers). The counts are what appeared while the loader ran.

# %%
class Images(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.full((256, 1024), float(i))  # 1 MiB a sample

def shm_used():
    st = os.statvfs('/dev/shm')
    return (st.f_blocks - st.f_bfree) * st.f_frsize

def in_flight(strategy):
    torchmem_magic.set_sharing_strategy(strategy)
    files_before, used_before = set(os.listdir('/dev/shm')), shm_used()
    loader = DataLoader(Images(), batch_size=4, num_workers=2)
    held = []
    for batch in loader:
        held.append(batch)  # four batches kept: 16 MiB in shared memory
        if len(held) == 4:
            break
    files = [f for f in os.listdir('/dev/shm') if f.startswith('torch_')]
    print(f"{strategy:16} new torch_* files in /dev/shm: {len(set(files) - files_before):3} · "
          f"more in use on the mount: {(shm_used() - used_before) / 2**20:5.1f} MiB")
    del loader, held

in_flight('file_descriptor')
in_flight('file_system')
torchmem_magic.set_sharing_strategy('file_descriptor');  # back to the default

# %% [markdown]
# With `file_descriptor` the segments are invisible to `ls`; with `file_system` they are files. Either way they take room on the mount (other programs' files count there too). `%%memwatch` reads the mount itself: the **shm** curve and row of the report, with the strategy in use.
#
# ## 3. A worker killed because `/dev/shm` is full
# A container's 64 MB `/dev/shm` is far too small for workers that prefetch large batches. When a worker writes into a full mount, the kernel sends it `SIGBUS`; the loop sees *DataLoader worker (pid N) is killed by signal: Bus error* — or, on a busy machine, only a reset connection. `%%memwatch` reads how the worker ended and what the curves showed just before, and explains it.
#
# To make it happen here without touching this machine's `/dev/shm`, we mount a 16 MiB tmpfs (this needs root) and give the workers a dataset that places every sample in shared memory on that mount the way torch does — create a file, size it, map it, write — and keeps it there, as batches waiting in a prefetch queue would. `--shm-path` tells `%%memwatch` to watch that mount instead of `/dev/shm`.

# %%
import mmap, subprocess, tempfile
small_shm = tempfile.mkdtemp(prefix='small-shm-')
mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=16m', 'tmpfs', small_shm],
                         capture_output=True).returncode == 0
if mounted:
    print(f'a 16 MiB tmpfs is mounted at {small_shm}, standing in for a container\'s /dev/shm')
    print(torchmem_magic.sharing_info(workers=2, shm_path=small_shm))
else:
    print('cannot mount a small tmpfs here (it needs root): the worker death below is skipped')


# %% [markdown]
# `sharing_info` already warns about a mount this small. Now the workers fill it:

# %%
class SharedSamples(Dataset):
    """Each sample goes to shared memory as torch's workers put it there: create, size, map, write."""
    def __init__(self, mount, size=1 << 20):
        self.mount, self.size = mount, size
    def __len__(self):
        return 200
    def __getitem__(self, i):
        time.sleep(0.02)
        fd = os.open(os.path.join(self.mount, f'segment-{i}'), os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, self.size)  # reserves nothing yet: tmpfs gives pages when they are written
        with mmap.mmap(fd, self.size) as segment:
            segment[:] = bytes([i % 256]) * self.size  # on a full mount: SIGBUS
        os.close(fd)
        return torch.tensor(i)


# %%
%%memwatch --interval 20 --shm-path {small_shm}
if mounted:
    loader = DataLoader(SharedSamples(small_shm), batch_size=1, num_workers=2)
    failure = None
    try:
        try:
            for step, x in enumerate(loader):
                optimizer.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()
        except (RuntimeError, ConnectionError) as error:  # torch's message, or on a busy machine a reset connection
            failure = f'{error}'
    except RuntimeError as again:  # torch's SIGCHLD handler reports a dead worker again while the loader lives
        failure = failure or f'{again}'
    print(f'the loop failed at step {step}: {failure}')
else:
    print('skipped: no small tmpfs')

# %% [markdown]
# Each worker printed torch's own hint (*Unexpected bus error encountered in worker. This might be caused by insufficient shared memory*), and the loop failed with whatever it happened to see. torch can report one death twice: where the loop waits for its batch, and again from its SIGCHLD handler while the loader's iterator lives, even inside the `except` that handles the first report, so the cell catches that one too and keeps only the text of the errors (an error object would keep the iterator alive). The verdict is a leak in shm, and the first line of advice explains the death from how the workers ended and what the shm curve showed just before: *DataLoader worker … died (Bus error): /tmp/small-shm-… was 100% full (16.0 MiB of 16.0 MiB)*. The next line is the fix. For room, what counts is a bigger mount for the container (`docker run --shm-size=8g` or `--ipc=host`) or fewer batches in flight (fewer workers, a lower `prefetch_factor`, smaller batches); `file_system` helps when file descriptors run out, but its files live on the same mount.

# %%
if mounted:
    died = torchmem_magic.last_report()
    print(died.advice[0])
    print(died.advice[1])
    del loader
    subprocess.run(['umount', '-l', small_shm])
os.rmdir(small_shm)
