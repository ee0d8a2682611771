import json,sys,urllib.request
port=sys.argv[1]; label=sys.argv[2] if len(sys.argv)>2 else ''
s=json.load(urllib.request.urlopen(f'http://127.0.0.1:{port}/_sim/state'))
for i in s['instances']:
    if label in i['label']:
        print({k:i[k] for k in ('id','label','live','actual_status','destroyed_by','billed_seconds','billed_usd','created_at','destroyed_at','live_pids')})
print('server_errors', s.get('server_errors'))
