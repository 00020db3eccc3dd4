"""Published weights by name, through a real HTTP server on 127.0.0.1: download, cache, checksum, resume, load."""
import hashlib
import http.server
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cpvt_backbones import create_model
from cpvt_backbones.convert import from_native, hub

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """Serves ``files`` (name -> bytes) with Content-Length, ETag (their sha256), range requests, and two faults:
    ``cut[name] = n`` closes the connection after n bytes (once), ``corrupt`` flips a byte in the named files."""

    def __init__(self):
        self.files, self.cut, self.corrupt, self.requests = {}, {}, set(), []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip('/')
                server.requests.append((name, self.headers.get('Range')))
                if name not in server.files:
                    self.send_error(404)
                    return
                data = server.files[name]
                if name in server.corrupt:
                    data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
                start = int(self.headers['Range'][len('bytes='):].split('-')[0]) if self.headers.get('Range') else 0
                self.send_response(206 if start else 200)
                self.send_header('Content-Length', str(len(data) - start))
                self.send_header('ETag', f'"{hashlib.sha256(server.files[name]).hexdigest()}"')
                self.end_headers()
                stop = server.cut.pop(name, len(data))
                self.wfile.write(data[start:stop])

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}'
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def weights(tmp_path, monkeypatch):
    """A server with pcpvt_tiny's weights in each layout and format, the table pointing at it, an empty cache."""
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
    assert not any(weights['cache'].iterdir())                   # nothing kept, under any name
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


def test_a_corrupted_cached_file_is_refused(weights):
    source = weights['table'][1]
    path = weights['cache'] / source.filename
    path.parent.mkdir(parents=True)
    path.write_bytes(weights['files'][source.filename][:-10])   # a truncated copy put there by hand
    with pytest.raises(hub.WeightsUnavailableError, match='does not match'):
        hub.fetch_weights('pcpvt_tiny', classifier=True)
    assert not path.exists()


def test_offline_names_the_urls_and_where_to_put_a_copy(weights, monkeypatch):
    dead = [hub.WeightSource('http://127.0.0.1:9/x.pth', 'x.pth', 'native')]
    monkeypatch.setitem(hub.PRETRAINED, 'pcpvt_tiny', tuple(dead))
    with pytest.raises(hub.WeightsUnavailableError) as info:
        create_model('pcpvt_tiny', pretrained=True)
    message = str(info.value)
    assert 'http://127.0.0.1:9/x.pth' in message and str(weights['cache'] / 'x.pth') in message
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
    det = load_config(str(ROOT / 'configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py'))
    assert runner_checkpoint(det, 'whatever.pth') == 'whatever.pth'  # a detector's checkpoint: mmengine's business
