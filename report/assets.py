"""The report's static parts: style sheet, content security policy and the page scripts (vanilla JS).

The policy lets the file load nothing from anywhere (no network, no other file): scripts and styles
are inline, images only data: URLs. The scripts read their data from JSON blocks and write run
strings with textContent (never innerHTML), or escape them before plotly renders them.
"""

CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1b1b1b;background:#fff}
header{padding:12px 24px;border-bottom:1px solid #ddd;background:#f7f7f9;position:sticky;top:0;z-index:5}
header h1{font-size:18px;margin:0 0 4px}nav a{margin-right:12px;font-size:13px;color:#2457a6;text-decoration:none}
main{padding:8px 24px 48px;max-width:1500px}section{margin:22px 0 30px}h2{font-size:17px;border-bottom:1px solid #e3e3e3;padding-bottom:3px}
h3{font-size:14px;margin:14px 0 6px}.source{color:#666;font-size:12px;margin:-6px 0 8px}.note{color:#6a4a00;background:#fff8e1;padding:6px 10px;border-radius:4px}
.missing{color:#555;background:#f1f1f1;padding:6px 10px;border-radius:4px;font-style:italic}
table{border-collapse:collapse;margin:6px 0;font-size:12.5px}th,td{border:1px solid #e1e1e1;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f5f7;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{width:240px}table.kv td{word-break:break-all}.cols{display:flex;gap:24px;flex-wrap:wrap}.cols>div{flex:1 1 420px;min-width:0}
.big{display:flex;gap:14px;flex-wrap:wrap;margin-bottom:10px}.big div{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:180px}
.big b{display:block;font-size:22px}.big span{color:#555;font-size:12px}.plot{width:100%;min-height:200px}
.errors{background:#fdecea;color:#611a15;padding:8px 24px;border-bottom:1px solid #f5c2c0}
.filters{display:flex;gap:10px;flex-wrap:wrap;align-items:center;margin:6px 0}.filters label{font-size:12px;color:#444}
.scroll{max-height:520px;overflow:auto;border:1px solid #eee}.worse{color:#a11}.better{color:#176b1f}.differs{color:#a11}
.drill select{max-width:640px}.drill h4{margin:10px 0 4px;font-size:13px}.drill .dominant{font-weight:700;color:#a11}
.bar{position:relative;width:220px;height:10px;background:#f3f3f3}.bar span{position:absolute;top:0;height:10px}.tag{display:inline-block;background:#eef;padding:0 6px;border-radius:3px;font-size:12px}
"""

ERROR_HOOK_JS = r"""
window.__reportErrors=[];
function __reportNote(msg){
  msg=String(msg);window.__reportErrors.push(msg);
  var box=document.getElementById('report-errors');if(!box)return;
  box.hidden=false;var li=document.createElement('li');li.textContent=msg;box.querySelector('ul').appendChild(li);
}
window.addEventListener('error',function(e){__reportNote('script error: '+(e.message||e));});
window.addEventListener('unhandledrejection',function(e){var r=e.reason;__reportNote('unhandled rejection: '+(r&&r.message||r));});
document.addEventListener('DOMContentLoaded',function(){
  var early=window.__reportErrors.slice();window.__reportErrors=[];early.forEach(__reportNote);
});
"""

PAGE_JS = r"""
(function(){
var FIGS=JSON.parse(document.getElementById('report-figures').textContent);
var DATA=JSON.parse(document.getElementById('report-data').textContent);
var CFG={responsive:true,displaylogo:false};
function esc(s){return String(s==null?'':s).replace(/&/g,'&amp;').replace(/</g,'&lt;').replace(/>/g,'&gt;').replace(/"/g,'&quot;');}
function el(tag,text,cls){var e=document.createElement(tag);if(text!=null)e.textContent=text;if(cls)e.className=cls;return e;}
function fmt(v){if(v===null||v===undefined)return '—';if(typeof v==='number'){return Number.isInteger(v)?v.toLocaleString('en'):v.toFixed(3);}return String(v);}
var pending=[];
function plot(div,fig){
  try{var p=Plotly.newPlot(div,fig.data,fig.layout,CFG);pending.push(Promise.resolve(p).catch(function(e){__reportNote('figure '+div.id+': '+(e&&e.message||e));}));return p;}
  catch(e){__reportNote('figure '+div.id+': '+e.message);}
}
Object.keys(FIGS).forEach(function(id){var d=document.getElementById(id);if(d)plot(d,FIGS[id]);});

/* the accounts: a filter per status column and a text search over the ids */
document.querySelectorAll('.acct').forEach(function(box){
  var src=DATA.accounts[box.dataset.key];if(!src)return;
  var cols=src.cols,rows=src.rows,limit=500,filters={},bar=box.querySelector('.filters');
  var text=el('input');text.type='search';text.placeholder='attempt / task / request id contains…';bar.appendChild(text);
  ['client_status','server_status','task_outcome','resource_status','finish_reason','good'].forEach(function(c){
    var i=cols.indexOf(c);if(i<0)return;var seen={};rows.forEach(function(r){seen[String(r[i])]=1;});
    var lab=el('label',c+' ');var sel=el('select');sel.appendChild(el('option','(all)'));sel.options[0].value='';
    Object.keys(seen).sort().forEach(function(v){var o=el('option',v==='null'?'(null)':v);o.value=v;sel.appendChild(o);});
    sel.addEventListener('change',draw);lab.appendChild(sel);bar.appendChild(lab);filters[c]={i:i,sel:sel};
  });
  var count=el('span','','tag');bar.appendChild(count);
  var thead=box.querySelector('thead'),tbody=box.querySelector('tbody'),tr=el('tr');
  cols.forEach(function(c){tr.appendChild(el('th',c));});thead.appendChild(tr);
  text.addEventListener('input',draw);
  function draw(){
    var q=text.value.toLowerCase(),shown=0,matched=0;tbody.textContent='';
    rows.forEach(function(r){
      for(var c in filters){var f=filters[c];if(f.sel.value!==''&&String(r[f.i])!==f.sel.value)return;}
      if(q&&[0,1,2].every(function(i){return String(r[i]==null?'':r[i]).toLowerCase().indexOf(q)<0;}))return;
      matched++;if(shown>=limit)return;shown++;
      var row=el('tr');r.forEach(function(v){row.appendChild(el('td',fmt(v),typeof v==='number'?'num':null));});tbody.appendChild(row);
    });
    count.textContent=matched+' of '+rows.length+' attempts match'+(matched>shown?' (first '+shown+' shown)':'');
  }
  draw();
});

/* drill-down: one attempt as a page: its accounts, its causes, its figures, its intervals (table and bars),
   its streams drawn, its events with their attrs as text */
var STREAM_ORDER=['client','link','server','engine'];
function streamRank(s){var i=STREAM_ORDER.indexOf(s);return i<0?9:i;}
function ms(v){return v===null||v===undefined?'—':v.toFixed(3);}
function kvRows(table,pairs){table.textContent='';pairs.forEach(function(p){var r=el('tr');r.appendChild(el('th',p[0]));
  var d=el('td',p[1]);if(p[2])d.className=p[2];r.appendChild(d);table.appendChild(r);});}
function figure(k,v){if(v===null||v===undefined)return '—';if(typeof v==='boolean')return v?'yes':'no';
  if(typeof v==='number'&&/_ms$/.test(k))return v.toFixed(3)+' ms';return fmt(v);}
function drawDrill(box,item){
  var a=item.acct||{};
  box.querySelector('.drill-title').textContent='attempt '+item.id+' · task '+fmt(a.task_id)+' · request '+fmt(a.request_id)
    +' · attempt '+fmt(a.attempt_index)+' of its request · '+item.group+' · drawn because: '+item.why;
  kvRows(box.querySelector('.drill-accounts'),[['attempt',item.id],['client status',fmt(a.client_status)],
    ['server status',fmt(a.server_status)],['task outcome',fmt(a.task_outcome)],['resource status',fmt(a.resource_status)]]);
  var c=item.causes,cp=[];
  if(!c){cp.push(['attempt_causes','not in this ledger']);}
  else{cp.push(['late',c.late?'yes, missed: '+c.missed:(c.late===false?'no':'—')],['deadline',figure('deadline_ms',c.deadline_ms)],
    ['dominant cause',c.dominant_cause==null?'none (every cause measured and 0)':c.dominant_cause]);
    ['client_queue','server_queue','prefill_interference','preemption','decode_stall','host_contention','transport','client',
     'spec_rejected'].forEach(function(k){var v=c[k+'_ms'];cp.push([k,v==null?'unknown':v.toFixed(3)+' ms',k===c.dominant_cause?'dominant':null]);});
    cp.push(['own prefill (not a cause)',figure('prefill_ms',c.prefill_ms)],['own decode (not a cause)',figure('decode_ms',c.decode_ms)],
      ['evidence',fmt(c.cause_evidence)]);}
  kvRows(box.querySelector('.drill-causes'),cp);
  var mp=Object.keys(item.metrics).map(function(k){return [k,figure(k,item.metrics[k])];});
  if(item.off_axis_outputs)mp.push(['output events off the axis',String(item.off_axis_outputs)]);
  kvRows(box.querySelector('.drill-metrics'),mp);
  var ivs=item.iv.slice().sort(function(x,y){return streamRank(x[0])-streamRank(y[0])||(x[3]===null)-(y[3]===null)||(x[3]||0)-(y[3]||0);});
  var t0=Infinity,t1=-Infinity;ivs.forEach(function(v){if(v[3]!==null&&v[4]!==null){t0=Math.min(t0,v[3]);t1=Math.max(t1,v[4]);}});
  var span=Math.max(t1-t0,1e-9),itb=box.querySelector('.drill-intervals tbody'),colors=DATA.colors||{};itb.textContent='';
  ivs.forEach(function(v){var r=el('tr');
    [v[0],v[1],v[2],ms(v[3]),ms(v[4]),v[9]==null?'—':v[9].toFixed(3),v[6]?v[6].toFixed(3):'',v[5]==null?'':v[5],v[7]?'yes':'no, off the path'].forEach(function(x,i){
      r.appendChild(el('td',x,i>=3&&i<=6?'num':null));});
    var cell=el('td'),bar=el('div',null,'bar');cell.appendChild(bar);
    if(v[3]!==null&&v[4]!==null){var b=el('span');b.style.left=(100*(v[3]-t0)/span).toFixed(2)+'%';
      b.style.width=Math.max(0.5,100*(v[4]-v[3])/span).toFixed(2)+'%';b.style.background=colors[v[1]]||'#aaaaaa';
      if(!v[7])b.style.outline='2px solid #d62728';bar.appendChild(b);}else{cell.textContent='(clock not on the axis)';}
    r.appendChild(cell);itb.appendChild(r);});
  var plotDiv=box.querySelector('.drill-plot');
  var streams=[];ivs.forEach(function(v){if(streams.indexOf(v[0])<0)streams.push(v[0]);});
  ['client','server','engine'].forEach(function(s){if(item.out[s]&&streams.indexOf(s)<0)streams.push(s);});
  streams.sort(function(x,y){return streamRank(x)-streamRank(y)||(x<y?-1:1);});
  var traces={},data=[];
  ivs.forEach(function(v){
    if(v[3]===null||v[4]===null)return;
    var key=v[0]+': '+v[1];var t=traces[key];
    if(!t){t=traces[key]={type:'bar',orientation:'h',name:esc(key),x:[],base:[],y:[],hovertext:[],hoverinfo:'text',width:0.6,
      marker:{color:colors[v[1]]||'#aaaaaa',line:{width:[],color:[]}}};data.push(t);}
    t.x.push(v[4]-v[3]);t.base.push(v[3]);t.y.push(esc(v[0]));
    t.marker.line.width.push(v[7]?0.5:2);t.marker.line.color.push(v[7]?'#444':'#d62728');
    t.hovertext.push(esc(v[0]+' · '+v[1])+': '+(v[4]-v[3]).toFixed(3)+' ms'+(v[6]?' ± '+v[6].toFixed(3):'')+' ('+esc(v[5])+(v[7]?'':', off the path')+')<br>'+v[3].toFixed(3)+' → '+v[4].toFixed(3)+' ms');
  });
  var sym={client:'line-ns-open',server:'line-ns-open',engine:'circle'};
  Object.keys(item.out).forEach(function(layer){
    var xs=item.out[layer];
    data.push({type:'scatter',mode:'markers',name:esc(layer+' output events ('+xs.length+')'),x:xs,y:xs.map(function(){return esc(layer);}),
      hoverinfo:'x+name',marker:{symbol:sym[layer]||'circle',size:layer==='engine'?4:8,color:'#111'}});
  });
  var layout={barmode:'overlay',height:140+40*streams.length,margin:{l:80,r:20,t:20,b:40},hovermode:'closest',
    xaxis:{title:{text:'ms on the report axis'},rangeslider:{visible:true,thickness:0.06}},
    yaxis:{type:'category',categoryorder:'array',categoryarray:streams.map(esc),autorange:'reversed'},legend:{font:{size:10}}};
  plot(plotDiv,{data:data,layout:layout});
  var tb=box.querySelector('.drill-events tbody');tb.textContent='';
  item.ev.forEach(function(e){var r=el('tr');
    [e[0]===null?'(clock not on axis)':e[0].toFixed(3),e[1],e[2],e[3],e[4],fmt(e[5]),e[6],e[7]].forEach(function(v,i){r.appendChild(el('td',v,i===0?'num':null));});
    tb.appendChild(r);});
}
document.querySelectorAll('.drill').forEach(function(box){
  var items=DATA.drill[box.dataset.key]||[],sel=box.querySelector('select');
  items.forEach(function(it,i){var o=el('option',it.id+' — '+it.group+' — '+(it.took_ms==null?'time unknown':it.took_ms.toFixed(1)+' ms')
    +' — '+it.why);o.value=String(i);sel.appendChild(o);});
  sel.addEventListener('change',function(){drawDrill(box,items[+sel.value]);});
  if(items.length)drawDrill(box,items[0]);
  box.selectAttempt=function(aid){for(var i=0;i<items.length;i++){if(items[i].id===aid){sel.value=String(i);drawDrill(box,items[i]);box.scrollIntoView({behavior:'smooth'});return true;}}return false;};
});
/* the timeline's rows: the order within each group (slowest first, or by arrival) and zooming to one group */
document.querySelectorAll('.tl-controls').forEach(function(bar){
  var div=document.getElementById(bar.dataset.fig),rows=DATA.timeline[bar.dataset.fig];if(!div||!rows)return;
  var order=bar.querySelector('.tl-order'),group=bar.querySelector('.tl-group');
  rows.groups.forEach(function(g,i){var o=el('option',g.label+' ('+g.n+')');o.value=String(i);group.appendChild(o);});
  order.addEventListener('change',function(){
    var ids=rows.orders[order.value],row={};ids.forEach(function(a,i){row[a]=i;});
    var ys=[],idx=[];div.data.forEach(function(t,i){if(t.customdata){idx.push(i);ys.push(t.customdata.map(function(a){return row[a];}));}});
    Plotly.restyle(div,{y:ys},idx);
    Plotly.relayout(div,{'yaxis.ticktext':ids.map(function(a){return esc(a.slice(0,28));})});
  });
  var time=bar.querySelector('.tl-time'),mode='sent';
  time.addEventListener('change',function(){  /* rows from each attempt's send, or all on the run's clock */
    if(time.value===mode)return;var sign=time.value==='run'?1:-1;mode=time.value;
    function shift(v,a){return Math.round((v+sign*(rows.offset[a]||0))*1e6)/1e6;}
    var bars=[],bi=[],pts=[],pi=[];
    div.data.forEach(function(t,i){if(!t.customdata)return;
      if(t.type==='bar'){bi.push(i);bars.push(t.base.map(function(b,j){return shift(b,t.customdata[j]);}));}
      else{pi.push(i);pts.push(t.x.map(function(x,j){return shift(x,t.customdata[j]);}));}});
    if(bi.length)Plotly.restyle(div,{base:bars},bi);
    if(pi.length)Plotly.restyle(div,{x:pts},pi);
    Plotly.relayout(div,{'xaxis.title.text':esc(rows.titles[mode]),'xaxis.autorange':true});
  });
  group.addEventListener('change',function(){
    var g=rows.groups[+group.value];
    Plotly.relayout(div,group.value===''?{'yaxis.autorange':'reversed'}:{'yaxis.range':[g.first+g.n-0.5,g.first-0.5]});
  });
});
/* clicking a row of the timeline opens that attempt below, when it has a drill-down */
Object.keys(DATA.gantt).forEach(function(id){
  var div=document.getElementById(id),box=document.querySelector('.drill[data-key="'+DATA.gantt[id]+'"]');
  if(!div||!box||!div.on)return;
  div.on('plotly_click',function(ev){var p=ev.points&&ev.points[0];if(p&&p.customdata!=null)box.selectAttempt(String(p.customdata));});
});
Promise.all(pending).then(function(){document.body.setAttribute('data-rendered',String(Object.keys(FIGS).length));});
})();
"""
