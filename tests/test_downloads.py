"""Downloads that survive real networks and many processes, through a real HTTP server on 127.0.0.1: a page a
captive portal answers with status 200 is never recorded as weights, a cached page is fetched again (or named when
offline), and concurrent fetches of one file (threads, processes, torchrun ranks) download it once."""
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from test_hub import Server, published_weights, same_weights

from cpvt_backbones import create_model
from cpvt_backbones.convert import hub, load_weights_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def weights(tmp_path, monkeypatch):
    """test_hub's: a server with pcpvt_tiny's weights, the published table pointing at it, an empty cache."""
    yield from published_weights(tmp_path, monkeypatch)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def small_weights(path: Path) -> bytes:
    """A small torch file (a few KiB): what the lock tests serve."""
    torch.save({'w': torch.arange(2000, dtype=torch.float32)}, path)
    return path.read_bytes()


def test_an_html_page_answered_with_200_is_never_recorded_and_the_file_comes_next_time(weights, capsys):
    """The captive portal answers the first request with an HTML page and status 200: the download is refused by
    its content (not recorded, not kept, the next source tried); once the network is fixed the file itself is
    fetched, checked and recorded."""
    server, cache = weights['server'], weights['cache']
    url = f'{server.url}/model.safetensors'
    server.pages['model.safetensors'] = 1
    with pytest.raises(hub.WeightsUnavailableError, match='not a weight file.*HTML page.*it was not kept'):
        hub.fetch_url(url)
    path = hub.url_path(url)
    assert not path.exists() and not hub.record_path(path).exists()
    assert not path.with_name(path.name + '.partial').exists()
    assert hub.fetch_url(url) == path and path.read_bytes() == server.files['model.safetensors']
    assert json.loads(hub.record_path(path).read_text())['content'] == 'weights'
    assert [name for name, _ in server.requests] == ['model.safetensors'] * 2
    # by name: the hub file is a portal page, the next published source is taken and the page never cached
    server.pages['model.safetensors'] = 1
    model = create_model('pcpvt_tiny', pretrained=True)
    assert same_weights(weights['model'], model)
    assert not (cache / 'tiny.in1k.safetensors').exists()
    assert (cache / weights['table'][1].filename).is_file()


def test_a_url_answering_404_is_named_in_the_error(server, tmp_path, monkeypatch):
    """``pretrained=`` a URL the server does not have: the error names the URL and the server's answer, and
    nothing is cached."""
    monkeypatch.setenv('CPVT_WEIGHTS_DIR', str(tmp_path / 'cache'))
    url = f'{server.url}/gone/pcpvt_tiny.pth'
    with pytest.raises(hub.WeightsUnavailableError) as info:
        create_model('pcpvt_tiny', pretrained=url)
    assert str(info.value).startswith(f'could not fetch {url} (HTTPError: HTTP Error 404'), str(info.value)
    assert server.requests == [('gone/pcpvt_tiny.pth', None)]
    assert not hub.url_path(url).exists() and not hub.url_path(url).with_name('pcpvt_tiny.pth.partial').exists()


def poison(path: Path, url: str, content: bytes) -> None:
    """What an older version left after a portal answered: the page under the weight file's name, with a record
    of its own sha256 (no 'content' field)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    hub.record_path(path).write_text(json.dumps(dict(url=url, sha256=hub.file_sha256(path))))


def test_a_cached_page_is_fetched_again_once_or_named_when_offline(weights, capsys):
    server = weights['server']
    url = f'{server.url}/model.safetensors'
    path = hub.url_path(url)
    poison(path, url, Server.PAGE)
    with pytest.raises(ValueError, match=f'HTML page.*delete {path} and its record'):
        load_weights_file(path)  # read directly, the error says which files to delete
    assert hub.fetch_url(url).read_bytes() == server.files['model.safetensors']
    err = capsys.readouterr().err
    assert f'{path}: its content is an HTML page' in err and 'downloading it again' in err
    assert len(server.requests) == 1
    assert hub.fetch_url(url) == path and len(server.requests) == 1  # checked and recorded now: from the cache
    poison(path, url, Server.PAGE)
    server.files.clear()  # offline (404): the error names the file to delete
    with pytest.raises(hub.WeightsUnavailableError, match=f'{path}: its content is an HTML page.*Delete {path} and'):
        hub.fetch_url(url)


def test_a_file_recorded_before_downloads_were_read_is_read_once(weights, tmp_path):
    """A record without the 'content' field (an older version's): the file is read once with the safe loader; a
    readable one is kept and its record completed, a damaged one (a torch zip cut short) fetched again."""
    server = weights['server']
    server.files['w.pth'] = small_weights(tmp_path / 'w.pth')
    url = f'{server.url}/w.pth'
    path = hub.url_path(url)
    poison(path, url, server.files['w.pth'])
    assert hub.fetch_url(url) == path and not server.requests  # read, not downloaded
    assert json.loads(hub.record_path(path).read_text())['content'] == 'weights'
    poison(path, url, server.files['w.pth'][:-30])  # the zip's directory cut off
    assert hub.fetch_url(url).read_bytes() == server.files['w.pth'] and len(server.requests) == 1


def _fetch_in_a_process(url: str, directory: str, results) -> None:
    try:
        path = hub.fetch_url(url, Path(directory))
        results.put(('ok', str(path), hub.file_sha256(path)))
    except BaseException as e:  # reported to the parent, whatever it is
        results.put(('error', f'{type(e).__name__}: {e}', None))


def test_four_processes_fetching_one_url_download_it_once(server, tmp_path):
    """Four processes ask for one URL at once (as the ranks of a distributed run build their backbones): one
    downloads (slowly: a second), the others wait on the file's lock and get the same checked file; the server
    sees one request."""
    server.files['w.pth'] = small_weights(tmp_path / 'w.pth')
    server.seconds['w.pth'] = 1.0
    url, cache = f'{server.url}/w.pth', tmp_path / 'cache'
    context = multiprocessing.get_context('fork')
    results = context.Queue()
    processes = [context.Process(target=_fetch_in_a_process, args=(url, str(cache), results)) for _ in range(4)]
    for p in processes:
        p.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for p in processes:
        p.join(timeout=30)
    assert all(kind == 'ok' for kind, _, _ in outcomes), outcomes
    assert {path for _, path, _ in outcomes} == {str(hub.url_path(url, cache))}
    assert {digest for _, _, digest in outcomes} == {hub.file_sha256(tmp_path / 'w.pth')}
    assert len(server.requests) == 1, server.requests


def test_four_threads_fetching_one_url_download_it_once(server, tmp_path):
    server.files['w.pth'] = small_weights(tmp_path / 'w.pth')
    server.seconds['w.pth'] = 0.5
    url, cache = f'{server.url}/w.pth', tmp_path / 'cache'
    paths, errors = [], []

    def fetch():
        try:
            paths.append(hub.fetch_url(url, cache))
        except Exception as e:  # collected for the assertion
            errors.append(e)
    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(paths) == 4 and len(set(paths)) == 1
    assert paths[0].read_bytes() == server.files['w.pth'] and len(server.requests) == 1


RANK_SCRIPT = '''
import sys
import torch.distributed as dist
from mmdet.registry import MODELS
import cpvt_backbones.adapters.mmdet  # noqa: F401
dist.init_process_group('gloo')
backbone = MODELS.build(dict(type='PyramidCPVT', arch='pcpvt_tiny',
                             init_cfg=dict(type='Pretrained', checkpoint=sys.argv[1])))
backbone.init_weights()
dist.barrier()
with open(f'{sys.argv[2]}/rank{dist.get_rank()}.txt', 'w') as f:
    f.write(repr(float(backbone.blocks[0][0].attn.q.weight.sum())))
dist.destroy_process_group()
'''


@pytest.mark.heavy
def test_torchrun_ranks_with_a_pretrained_url_download_it_once(weights, tmp_path):
    """mmengine's Pretrained init_cfg on every rank of a torchrun (2 CPU ranks, gloo): one download, both ranks
    load the same weights."""
    pytest.importorskip('mmdet')
    torchrun = shutil.which('torchrun', path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip('torchrun is not installed beside this python')
    server = weights['server']
    server.seconds['model.safetensors'] = 1.0
    script = tmp_path / 'rank.py'
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, CPVT_WEIGHTS_DIR=str(tmp_path / 'ranks_cache'), OMP_NUM_THREADS='1',
               PYTHONPATH=str(ROOT))
    res = subprocess.run([torchrun, '--standalone', '--nproc_per_node=2', str(script),
                          f'{server.url}/model.safetensors', str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    loaded = {(tmp_path / f'rank{r}.txt').read_text() for r in range(2)}
    expected = float(weights['model'].blocks[0][0].attn.q.weight.sum())
    assert loaded == {repr(expected)}, (loaded, expected)
    assert [name for name, _ in server.requests] == ['model.safetensors'], server.requests
