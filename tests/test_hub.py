"""Published weights by name, through a real HTTP server on 127.0.0.1: download, cache, checksum, resume, load."""
import hashlib
import http.server
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cpvt_backbones import create_model
from cpvt_backbones.convert import from_native, hub

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """Serves ``files`` (name -> bytes) with Content-Length, ETag (their sha256, or ``etags[name]`` where set: a
    validator that is not a checksum), range requests honouring If-Range, and three faults: ``cut[name] = n`` closes
    the connection after n bytes (once), ``corrupt`` flips a byte in the named files, ``pages[name] = n`` answers
    the next n requests for ``name`` with status 200 and an HTML page (a captive portal). ``seconds[name]``: how
    long sending the file takes (in ten pieces), for requests that overlap."""

    PAGE = b'<!DOCTYPE html>\n<html><head><title>Sign in to the network</title></head><body>Wi-Fi</body></html>\n'

    def __init__(self):
        self.files, self.cut, self.corrupt, self.requests, self.etags = {}, {}, set(), [], {}
        self.pages, self.seconds = {}, {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip('/')
                server.requests.append((name, self.headers.get('Range')))
                if server.pages.get(name):
                    server.pages[name] -= 1
                    self.send_response(200)
                    self.send_header('Content-Type', 'text/html')
                    self.send_header('Content-Length', str(len(server.PAGE)))
                    self.end_headers()
                    self.wfile.write(server.PAGE)
                    return
                if name not in server.files:
                    self.send_error(404)
                    return
                data = server.files[name]
                if name in server.corrupt:
                    data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
                etag = server.etags.get(name) or f'"{hashlib.sha256(server.files[name]).hexdigest()}"'
                start = int(self.headers['Range'][len('bytes='):].split('-')[0]) if self.headers.get('Range') else 0
                if self.headers.get('If-Range', etag) != etag:
                    start = 0  # changed since the client's copy: the whole file
                self.send_response(206 if start else 200)
                self.send_header('Content-Length', str(len(data) - start))
                if start:
                    self.send_header('Content-Range', f'bytes {start}-{len(data) - 1}/{len(data)}')
                self.send_header('ETag', etag)
                self.end_headers()
                stop = server.cut.pop(name, len(data))
                piece = -(-(stop - start) // 10)
                for at in range(start, stop, max(piece, 1)):
                    self.wfile.write(data[at:min(at + piece, stop)])
                    self.wfile.flush()
                    time.sleep(server.seconds.get(name, 0) / 10)

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}'
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def weights(tmp_path, monkeypatch):
    """A server with pcpvt_tiny's weights in each layout and format, the table pointing at it, an empty cache."""
    yield from published_weights(tmp_path, monkeypatch)


def published_weights(tmp_path, monkeypatch):
    """What the ``weights`` fixture yields (a generator: the server is closed after the test)."""
    torch.manual_seed(3)
    model = create_model('pcpvt_tiny').eval()
    sd = model.state_dict()
    files = {}
    save_file(sd, tmp_path / 'a.safetensors')
    files['model.safetensors'] = (tmp_path / 'a.safetensors').read_bytes()
    for layout, wrap in (('native', lambda d: d), ('mmseg', lambda d: dict(state_dict=d, meta={})),
                         ('mmpretrain', lambda d: dict(state_dict=d))):
        torch.save(wrap(from_native(sd, layout)), tmp_path / f'{layout}.pth')
        data = (tmp_path / f'{layout}.pth').read_bytes()
        files[f'tiny_{layout}-{hashlib.sha256(data).hexdigest()[:8]}.pth'] = data
    server = Server()
    server.files.update(files)
    hub_file, twins_file, mmseg_file, mmpretrain_file = files
    prefix = hub._hash_in_name
    table = (hub.WeightSource(f'{server.url}/{hub_file}', 'tiny.in1k.safetensors', 'native'),
             hub.WeightSource(f'{server.url}/{twins_file}', twins_file, 'native', prefix(twins_file)),
             hub.WeightSource(f'{server.url}/{mmseg_file}', mmseg_file, 'mmseg', prefix(mmseg_file), classifier=False),
             hub.WeightSource(f'{server.url}/{mmpretrain_file}', mmpretrain_file, 'mmpretrain',
                              prefix(mmpretrain_file)))
    assert all(len(s.sha256_prefix) == 8 for s in table[1:])
    monkeypatch.setitem(hub.PRETRAINED, 'pcpvt_tiny', table)
    cache = tmp_path / 'cache'
    monkeypatch.setenv('CPVT_WEIGHTS_DIR', str(cache))
    yield dict(server=server, model=model, table=table, cache=cache, files=files)
    server.close()


def same_weights(reference: torch.nn.Module, model: torch.nn.Module, skip=()) -> bool:
    """Every tensor of ``model`` (outside ``skip``) equals the reference's under the same key."""
    ref = reference.state_dict()
    return all(torch.equal(v, ref[k]) for k, v in model.state_dict().items() if not k.startswith(tuple(skip)))


def test_fetched_once_then_read_from_the_cache(weights):
    model = create_model('pcpvt_tiny', pretrained=True).eval()
    assert same_weights(weights['model'], model)
    assert (weights['cache'] / 'tiny.in1k.safetensors').is_file()
    assert [name for name, _ in weights['server'].requests] == ['model.safetensors']
    dense = create_model('pcpvt_tiny', pretrained=True, features_only=True, out_indices=(1, 2))
    assert same_weights(weights['model'], dense)
    ten = create_model('pcpvt_tiny', pretrained=True, num_classes=10)  # a fresh head, the rest loaded
    assert ten.head.weight.shape == (10, 256) and same_weights(weights['model'], ten, skip=('head.',))
    assert len(weights['server'].requests) == 1  # everything after the first call came from the cache


def test_every_layout_and_format_loads(weights):
    for source in weights['table']:
        path = hub.download(source, weights['cache'] / source.filename)
        model = create_model('pcpvt_tiny', pretrained=str(path), **({} if source.classifier else
                                                                     dict(features_only=True)))
        assert same_weights(weights['model'], model), source.layout


def test_falls_back_to_the_next_source_and_backbones_skip_headless_ones(weights):
    del weights['server'].files['model.safetensors']        # the hub file is gone: 404
    path, source = hub.fetch_weights('pcpvt_tiny', classifier=True)
    assert source is weights['table'][1] and path.name == source.filename
    assert not (weights['cache'] / 'tiny.in1k.safetensors').exists()
    assert [s.layout for s in hub.sources('pcpvt_tiny', classifier=True)] == ['native', 'native', 'mmpretrain']


def test_a_corrupted_download_is_refused_and_not_kept(weights):
    server = weights['server']
    server.corrupt.update(server.files)
    with pytest.raises(hub.WeightsUnavailableError, match='does not match the published') as info:
        create_model('pcpvt_tiny', pretrained=True)
    assert 'tried, in order' in str(info.value)
    assert not [p for p in weights['cache'].iterdir() if p.suffix != '.lock']  # nothing kept, under any name
    server.corrupt.clear()
    assert same_weights(weights['model'], create_model('pcpvt_tiny', pretrained=True))


def test_an_interrupted_download_resumes_and_is_never_taken_as_whole(weights, monkeypatch):
    server = weights['server']
    name = next(iter(server.files))
    server.cut[name] = len(server.files[name]) // 3
    monkeypatch.setitem(hub.PRETRAINED, 'pcpvt_tiny', weights['table'][:1])
    with pytest.raises(hub.WeightsUnavailableError, match='connection ended after .* resumes from it'):
        create_model('pcpvt_tiny', pretrained=True)
    final = weights['cache'] / 'tiny.in1k.safetensors'
    partial = final.with_name(final.name + '.partial')
    assert not final.exists() and partial.stat().st_size == len(server.files[name]) // 3
    model = create_model('pcpvt_tiny', pretrained=True)
    assert server.requests[-1] == (name, f'bytes={len(server.files[name]) // 3}-')   # resumed, not restarted
    assert same_weights(weights['model'], model) and final.is_file() and not partial.exists()


def test_a_corrupted_cached_file_is_downloaded_again(weights, monkeypatch):
    source = weights['table'][1]
    monkeypatch.setitem(hub.PRETRAINED, 'pcpvt_tiny', (source,))
    path = weights['cache'] / source.filename
    path.parent.mkdir(parents=True)
    path.write_bytes(weights['files'][source.filename][:-10])   # a truncated copy put there by hand
    path, _ = hub.fetch_weights('pcpvt_tiny', classifier=True)
    assert path.read_bytes() == weights['files'][source.filename]
    assert weights['server'].requests[-1][0] == source.filename


def test_the_cache_is_checked_on_every_load_not_only_after_a_download(weights, capsys):
    server, cache = weights['server'], weights['cache']
    create_model('pcpvt_tiny', pretrained=True)
    hub_file = cache / 'tiny.in1k.safetensors'
    assert hub.record_path(hub_file).is_file() and len(server.requests) == 1
    torch.manual_seed(99)  # random weights under the hub file's cache name: its record catches them
    save_file(create_model('pcpvt_tiny').state_dict(), hub_file)
    assert same_weights(weights['model'], create_model('pcpvt_tiny', pretrained=True))
    assert 'differs from the' in capsys.readouterr().err and len(server.requests) == 2  # downloaded again
    hub.record_path(hub_file).unlink()  # no record and no published checksum: not trusted, downloaded again
    assert same_weights(weights['model'], create_model('pcpvt_tiny', pretrained=True)) and len(server.requests) == 3
    save_file(create_model('pcpvt_tiny').state_dict(), hub_file)
    server.files.clear()  # offline: the error names the file and what to do
    with pytest.raises(hub.WeightsUnavailableError, match=f'{hub_file}: its sha256 .* Delete {hub_file}'):
        hub.fetch_weights('pcpvt_tiny', classifier=True)


def test_urls_are_cached_by_the_whole_url(weights, tmp_path):
    server = weights['server']
    torch.manual_seed(5)
    other = create_model('pcpvt_tiny').eval()
    save_file(other.state_dict(), tmp_path / 'b.safetensors')
    server.files['other/model.safetensors'] = (tmp_path / 'b.safetensors').read_bytes()
    first = hub.fetch_url(f'{server.url}/model.safetensors')
    second = hub.fetch_url(f'{server.url}/other/model.safetensors')
    assert first != second and first.name == second.name == 'model.safetensors'
    assert same_weights(weights['model'], create_model('pcpvt_tiny', pretrained=f'{server.url}/model.safetensors'))
    assert same_weights(other, create_model('pcpvt_tiny', pretrained=f'{server.url}/other/model.safetensors'))
    assert len(server.requests) == 2  # each fetched once


@pytest.mark.parametrize('etag', [None, '"v1"'], ids=['sha256-etag', 'opaque-etag'])
def test_a_resume_never_splices_two_versions_of_a_file(weights, tmp_path, etag):
    server = weights['server']
    url = f'{server.url}/model.safetensors'
    if etag:
        server.etags['model.safetensors'] = etag
    old = server.files['model.safetensors']
    server.cut['model.safetensors'] = len(old) // 2
    with pytest.raises(hub.WeightsUnavailableError, match='resumes from it'):
        hub.fetch_url(url)
    torch.manual_seed(6)  # the file changes on the server before the resume
    newer = create_model('pcpvt_tiny').eval()
    save_file(newer.state_dict(), tmp_path / 'new.safetensors')
    server.files['model.safetensors'] = (tmp_path / 'new.safetensors').read_bytes()
    if etag:
        server.etags['model.safetensors'] = '"v2"'
    path = hub.fetch_url(url)
    assert server.requests[-1][1] == f'bytes={len(old) // 2}-'   # a resume was asked for, under If-Range
    assert path.read_bytes() == server.files['model.safetensors']  # and the whole new file came back
    server.files['model.safetensors'] = old
    server.cut['model.safetensors'] = len(old) // 2
    partial = hub.url_path(url).with_name('model.safetensors.partial')
    path.unlink()
    with pytest.raises(hub.WeightsUnavailableError):
        hub.fetch_url(url)
    partial.with_name(partial.name + '.json').unlink()  # a partial file without its validator: started over
    assert hub.fetch_url(url).read_bytes() == old and server.requests[-1][1] is None


def test_offline_names_the_urls_and_where_to_put_a_copy(weights, monkeypatch):
    dead = [hub.WeightSource('http://127.0.0.1:9/x.pth', 'x.pth', 'native')]
    monkeypatch.setitem(hub.PRETRAINED, 'pcpvt_tiny', tuple(dead))
    with pytest.raises(hub.WeightsUnavailableError) as info:
        create_model('pcpvt_tiny', pretrained=True)
    message = str(info.value)
    assert 'http://127.0.0.1:9/x.pth' in message and 'pretrained=PATH' in message and str(weights['cache']) in message
    unpublished = "no weights are published for 'cpvt_small'.*cpvt-small_8xb128"
    with pytest.raises(hub.WeightsUnavailableError, match=unpublished):
        create_model('cpvt_small', pretrained=True)
    with pytest.raises(FileNotFoundError, match="'nope.pth' is not a file, a URL or a model"):
        create_model('pcpvt_tiny', pretrained='nope.pth')


def test_the_published_table_is_what_the_issue_lists():
    small = hub.PRETRAINED['pcpvt_small']
    assert [s.layout for s in small] == ['native', 'native', 'mmseg']
    assert small[0].url.endswith('timm/twins_pcpvt_small.in1k/resolve/main/model.safetensors')
    assert small[1].sha256_prefix == 'e70e7e7a' and small[2].sha256_prefix == 'e638c41c' and not small[2].classifier
    assert [s[1].sha256_prefix for s in (hub.PRETRAINED['pcpvt_base'], hub.PRETRAINED['pcpvt_large'])] == \
        ['e5ecb09b', 'd273f802']


def test_timm_and_openmmlab_take_names_and_urls(weights):
    pytest.importorskip('mmdet')
    timm = pytest.importorskip('timm')
    from mmdet.registry import MODELS

    import cpvt_backbones.adapters.mmdet  # noqa: F401
    import cpvt_backbones.adapters.timm  # noqa: F401
    assert same_weights(weights['model'], timm.create_model('pcpvt_tiny', pretrained=True))
    url = weights['table'][2].url  # mmseg's layout, no head: a backbone takes it
    for checkpoint in ('pcpvt_tiny', url):
        backbone = MODELS.build(dict(type='PyramidCPVT', arch='pcpvt_tiny',
                                     init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))
        backbone.init_weights()
        assert same_weights(weights['model'], backbone)


def test_an_imagenet_config_evaluates_weights_by_name(weights, tmp_path):
    pytest.importorskip('mmpretrain')
    from cpvt_backbones.adapters.runner import load_config, runner_checkpoint
    cfg = load_config(str(ROOT / 'configs/shapes/pcpvt-tiny_shapes-cls.py'), work_dir=str(tmp_path / 'w'))
    path = runner_checkpoint(cfg, 'pcpvt_tiny')
    state = torch.load(path, weights_only=True)['state_dict']
    assert 'head.fc.weight' in state and 'backbone.blocks.0.0.attn.q.weight' in state
    assert runner_checkpoint(cfg, path) == path  # already a classifier checkpoint: used as it is
    torch.manual_seed(7)  # two weight files of one name, different content: two classifier checkpoints
    for folder in (tmp_path / 'a', tmp_path / 'b'):
        folder.mkdir()
        save_file(create_model('pcpvt_tiny').state_dict(), folder / 'w.safetensors')
    first, second = (runner_checkpoint(cfg, str(tmp_path / f / 'w.safetensors')) for f in 'ab')
    assert first != second
    assert not torch.equal(torch.load(first, weights_only=True)['state_dict']['head.fc.weight'],
                           torch.load(second, weights_only=True)['state_dict']['head.fc.weight'])
    det = load_config(str(ROOT / 'configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py'))
    assert runner_checkpoint(det, 'whatever.pth') == 'whatever.pth'  # a detector's checkpoint: mmengine's business
