//! The display's state: the folded run ([`RunView`]) and what the person looking at it chose (screen,
//! selection, sort, filters, scroll). Keys change it through [`App::handle_key`] (`&mut self`);
//! drawing only reads it (`&self`, see [`super::ui`]).

use std::collections::HashMap;
use std::path::PathBuf;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::types::{LogRecord, TaskId, Verdict};
use crate::view::{RunView, Stage};

/// Where the records come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A run in this process: quitting cancels it.
    Live,
    /// A run in another process (or a finished one), read-only.
    Watch,
    /// A recorded run played back.
    Replay,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Task,
    State,
    Turn,
    Verdict,
    Speedup,
}

impl SortKey {
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Task => "task",
            SortKey::State => "state",
            SortKey::Turn => "turn",
            SortKey::Verdict => "verdict",
            SortKey::Speedup => "speedup",
        }
    }

    fn next(self) -> Self {
        match self {
            SortKey::Task => SortKey::State,
            SortKey::State => SortKey::Turn,
            SortKey::Turn => SortKey::Verdict,
            SortKey::Verdict => SortKey::Speedup,
            SortKey::Speedup => SortKey::Task,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    All,
    /// The latest finished turn is not correct.
    Failing,
    /// Not done.
    Running,
    Done,
}

impl StateFilter {
    pub fn label(self) -> &'static str {
        match self {
            StateFilter::All => "all",
            StateFilter::Failing => "failing",
            StateFilter::Running => "running",
            StateFilter::Done => "done",
        }
    }

    fn next(self) -> Self {
        match self {
            StateFilter::All => StateFilter::Failing,
            StateFilter::Failing => StateFilter::Running,
            StateFilter::Running => StateFilter::Done,
            StateFilter::Done => StateFilter::All,
        }
    }
}

/// Which tasks the table shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    pub state: StateFilter,
    pub level: Option<u32>,
    /// Tasks whose latest verdict is this.
    pub verdict: Option<Verdict>,
}

/// The task detail screen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detail {
    pub task: TaskId,
    /// The turn shown (1-based).
    pub turn: u32,
    /// Lines scrolled down.
    pub scroll: u16,
    /// Keep showing the task's current turn as it moves on.
    pub follow: bool,
    /// Show the whole prompt rather than the start of each message.
    pub full_prompt: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screen {
    Tasks,
    Detail(Detail),
}

/// What a key asks of the loop, beyond the app's own state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop the live run (cleanly: the engine logs `run_ended` and the UI stays open).
    Cancel,
    /// Leave now, without waiting for the run to stop.
    ForceQuit,
    /// Leave (the run is over, or the source is read-only).
    Quit,
    Replay(ReplayCmd),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayCmd {
    TogglePause,
    /// The next record.
    Step,
    /// Until any task finishes a turn.
    NextTurn,
    /// Until this task finishes a turn.
    TaskTurn(TaskId),
    /// Until this task has finished turn N.
    TaskTurnN(TaskId, u32),
    End,
    Faster,
    Slower,
}

/// Facts about the run that are not in its log (from its config, or the process running it).
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// The configured model name.
    pub model: Option<String>,
    /// The configured compile workers and LLM concurrency: the header's "busy of".
    pub compile_workers: Option<u32>,
    pub llm_concurrency: Option<u32>,
    /// Where prompt files and compile logs are read from.
    pub run_dir: Option<PathBuf>,
}

/// One GPU's utilisation and memory, as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuStat {
    /// `cuda:0`, matching the lease events' device names.
    pub device: String,
    /// Percent of the last sample period a kernel ran.
    pub util_pct: u32,
    /// Device memory in use and in all, in bytes.
    pub mem_used: u64,
    pub mem_total: u64,
}

/// Replay position and pace, for the header and footer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayStatus {
    pub paused: bool,
    /// Recorded time played per real second.
    pub speed: f64,
    /// Records played so far, of the log's `total`.
    pub played: usize,
    pub total: usize,
}

/// Files larger than this are shown cut (a compiler log can be megabytes).
const MAX_FILE_BYTES: usize = 256 * 1024;

/// The terminal UI's state: the run as folded so far, and what the user has chosen to see.
pub struct App {
    /// The run folded from the records the source has sent.
    pub view: RunView,
    /// Live, watched or replayed: what quitting and the keys do.
    pub mode: Mode,
    /// What the header shows that the log does not hold.
    pub meta: Meta,
    /// The task table, or one task's detail.
    pub screen: Screen,
    /// Index into [`App::rows`].
    pub selected: usize,
    /// The task table's order, reversed when `reverse`.
    pub sort: SortKey,
    pub reverse: bool,
    /// Which tasks the table shows.
    pub filter: Filter,
    /// The key help is shown over the screen.
    pub help: bool,
    /// A cancellation was asked for (live).
    pub stopping: bool,
    /// The source will send nothing more (the live engine is gone).
    pub closed: bool,
    /// Where a replay stands (replays only).
    pub replay: Option<ReplayStatus>,
    /// The GPUs' latest readings, for the resources panel (empty without NVML).
    pub gpus: Vec<GpuStat>,
    /// The latest problem reading the source.
    pub warning: Option<String>,
    /// Devices the run was given, shown before any lease names them (kept across rebuilds).
    devices: Vec<String>,
    /// Run-directory files read for the detail screen, by the path the log names.
    files: HashMap<String, String>,
    /// How far the detail text can scroll, as the last frame laid it out (written while drawing:
    /// only the frame knows the width the text wraps to).
    pub(crate) detail_max_scroll: std::cell::Cell<u16>,
}

impl App {
    pub fn new(mode: Mode, meta: Meta) -> Self {
        App {
            view: RunView::new(),
            mode,
            meta,
            screen: Screen::Tasks,
            selected: 0,
            sort: SortKey::Task,
            reverse: false,
            filter: Filter {
                state: StateFilter::All,
                level: None,
                verdict: None,
            },
            help: false,
            stopping: false,
            closed: false,
            replay: None,
            gpus: Vec::new(),
            warning: None,
            devices: Vec::new(),
            files: HashMap::new(),
            detail_max_scroll: std::cell::Cell::new(u16::MAX),
        }
    }

    /// Devices to show before any lease names them.
    pub fn set_devices(&mut self, devices: Vec<String>) {
        for d in &devices {
            self.view.add_device(d);
        }
        self.devices = devices;
    }

    pub fn apply(&mut self, rec: &LogRecord) {
        self.view.apply(rec);
        self.after_update();
    }

    /// Start over from a view rebuilt from the log.
    pub fn reset(&mut self, view: RunView) {
        self.view = view;
        for d in &self.devices {
            self.view.add_device(d);
        }
        self.after_update();
    }

    fn after_update(&mut self) {
        if let Screen::Detail(d) = &mut self.screen
            && d.follow
            && let Some(t) = self.view.tasks.get(&d.task)
        {
            let current = t.turn.max(1);
            if current != d.turn {
                d.turn = current;
                d.scroll = 0;
            }
        }
        // The selection is kept inside the rows by keys and by drawing, not here: records can come
        // thousands a second, and sorting the table for each would be the UI's main cost.
    }

    /// The run is over: its `run_ended` arrived, or the live engine is gone.
    pub fn run_over(&self) -> bool {
        self.view.ended.is_some() || self.closed
    }

    /// The tasks the table shows, filtered and sorted.
    pub fn rows(&self) -> Vec<TaskId> {
        let f = self.filter;
        let mut rows: Vec<&crate::view::TaskView> = self
            .view
            .tasks
            .values()
            .filter(|t| match f.state {
                StateFilter::All => true,
                StateFilter::Failing => t.failing(),
                StateFilter::Running => t.stage != Stage::Done,
                StateFilter::Done => t.stage == Stage::Done,
            })
            .filter(|t| f.level.is_none_or(|l| t.id.problem.level == l))
            .filter(|t| f.verdict.is_none_or(|v| t.last_verdict() == Some(v)))
            .collect();
        match self.sort {
            SortKey::Task => {}
            SortKey::State => rows.sort_by_key(|t| t.stage),
            SortKey::Turn => rows.sort_by_key(|t| t.turn),
            SortKey::Verdict => rows.sort_by_key(|t| t.last_verdict().map(Verdict::as_str)),
            // Fastest first, then tasks without a correct candidate.
            SortKey::Speedup => rows.sort_by(|a, b| {
                let key = |t: &crate::view::TaskView| t.best_speedup().unwrap_or(f64::NEG_INFINITY);
                key(b).total_cmp(&key(a))
            }),
        }
        if self.reverse {
            rows.reverse();
        }
        rows.into_iter().map(|t| t.id).collect()
    }

    /// The task the keys act on: the open one, or the table's selection.
    pub fn selected_task(&self) -> Option<TaskId> {
        match &self.screen {
            Screen::Detail(d) => Some(d.task),
            Screen::Tasks => {
                let rows = self.rows();
                rows.get(self.selected.min(rows.len().saturating_sub(1)))
                    .copied()
            }
        }
    }

    fn clamp(&mut self) {
        let n = self.rows().len();
        self.selected = self.selected.min(n.saturating_sub(1));
    }

    /// A key press; returns what the loop must do beyond updating this state.
    pub fn handle_key(&mut self, key: KeyEvent) -> Option<Action> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        let ctrl_c = key.modifiers.contains(KeyModifiers::CONTROL)
            && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('C'));
        if ctrl_c {
            return Some(self.quit_action());
        }
        if self.help {
            // Any key closes the help.
            self.help = false;
            return None;
        }
        match key.code {
            KeyCode::Char('?') => {
                self.help = true;
                return None;
            }
            KeyCode::Char('q') => {
                if matches!(self.screen, Screen::Detail(_)) {
                    self.screen = Screen::Tasks;
                    return None;
                }
                return Some(self.quit_action());
            }
            KeyCode::Esc => {
                self.screen = Screen::Tasks;
                return None;
            }
            _ => {}
        }
        if self.mode == Mode::Replay
            && let Some(cmd) = self.replay_key(key.code)
        {
            return Some(Action::Replay(cmd));
        }
        match self.screen.clone() {
            Screen::Tasks => self.tasks_key(key.code),
            Screen::Detail(d) => self.detail_key(d, key.code),
        }
        None
    }

    /// `q` at the top and Ctrl-C: the first asks a live run to stop, the second leaves at once.
    fn quit_action(&mut self) -> Action {
        if self.mode != Mode::Live || self.run_over() {
            return Action::Quit;
        }
        if self.stopping {
            Action::ForceQuit
        } else {
            self.stopping = true;
            Action::Cancel
        }
    }

    fn replay_key(&mut self, code: KeyCode) -> Option<ReplayCmd> {
        let task = self.selected_task();
        Some(match code {
            KeyCode::Char(' ') => ReplayCmd::TogglePause,
            KeyCode::Char('n') | KeyCode::Char('.') => ReplayCmd::Step,
            KeyCode::Char('t') => ReplayCmd::NextTurn,
            KeyCode::Char('T') => ReplayCmd::TaskTurn(task?),
            KeyCode::Char('E') => ReplayCmd::End,
            KeyCode::Char('+') | KeyCode::Char('=') => ReplayCmd::Faster,
            KeyCode::Char('-') => ReplayCmd::Slower,
            KeyCode::Char(c @ '1'..='9') => {
                let n = c as u32 - '0' as u32;
                if let Screen::Detail(d) = &mut self.screen {
                    d.turn = n;
                    d.scroll = 0;
                    d.follow = false;
                }
                ReplayCmd::TaskTurnN(task?, n)
            }
            _ => return None,
        })
    }

    fn tasks_key(&mut self, code: KeyCode) {
        self.clamp();
        let n = self.rows().len();
        let last = n.saturating_sub(1);
        match code {
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.selected = (self.selected + 1).min(last),
            KeyCode::PageUp => self.selected = self.selected.saturating_sub(10),
            KeyCode::PageDown => self.selected = (self.selected + 10).min(last),
            KeyCode::Home | KeyCode::Char('g') => self.selected = 0,
            KeyCode::End | KeyCode::Char('G') => self.selected = last,
            KeyCode::Enter => {
                if let Some(task) = self.rows().get(self.selected).copied() {
                    let turn = self.view.tasks.get(&task).map_or(1, |t| t.turn.max(1));
                    self.screen = Screen::Detail(Detail {
                        task,
                        turn,
                        scroll: 0,
                        follow: true,
                        full_prompt: false,
                    });
                }
            }
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('r') => self.reverse = !self.reverse,
            KeyCode::Char('f') => self.filter.state = self.filter.state.next(),
            KeyCode::Char('L') => self.filter.level = self.next_level(),
            KeyCode::Char('v') => self.filter.verdict = self.next_verdict(),
            _ => {}
        }
        self.clamp();
    }

    fn next_level(&self) -> Option<u32> {
        let mut levels: Vec<u32> = self.view.tasks.keys().map(|t| t.problem.level).collect();
        levels.dedup();
        cycle(&levels, self.filter.level)
    }

    fn next_verdict(&self) -> Option<Verdict> {
        let mut seen: Vec<Verdict> = self
            .view
            .tasks
            .values()
            .filter_map(|t| t.last_verdict())
            .collect();
        seen.sort_by_key(|v| v.as_str());
        seen.dedup();
        cycle(&seen, self.filter.verdict)
    }

    fn detail_key(&mut self, mut d: Detail, code: KeyCode) {
        let (max_turn, current) = self
            .view
            .tasks
            .get(&d.task)
            .map_or((1, 1), |t| (t.turn.max(1), t.turn.max(1)));
        match code {
            KeyCode::Up | KeyCode::Char('k') => d.scroll = d.scroll.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => d.scroll = d.scroll.saturating_add(1),
            KeyCode::PageUp => d.scroll = d.scroll.saturating_sub(20),
            KeyCode::PageDown | KeyCode::Char(' ') => d.scroll = d.scroll.saturating_add(20),
            KeyCode::Home | KeyCode::Char('g') => d.scroll = 0,
            KeyCode::Left | KeyCode::Char('h') | KeyCode::BackTab => {
                d.turn = d.turn.saturating_sub(1).max(1);
                d.scroll = 0;
            }
            KeyCode::Right | KeyCode::Char('l') | KeyCode::Tab => {
                d.turn = (d.turn + 1).min(max_turn);
                d.scroll = 0;
            }
            KeyCode::Char(c @ '1'..='9') => {
                d.turn = (c as u32 - '0' as u32).min(max_turn);
                d.scroll = 0;
            }
            KeyCode::End | KeyCode::Char('G') => d.scroll = self.detail_max_scroll.get(),
            KeyCode::Char('p') => d.full_prompt = !d.full_prompt,
            _ => {}
        }
        d.scroll = d.scroll.min(self.detail_max_scroll.get());
        d.follow = d.turn == current;
        self.screen = Screen::Detail(d);
    }

    /// Bring derived state up to date before a frame: the view's curve and the files the detail
    /// screen shows. Drawing itself only reads.
    pub fn before_draw(&mut self) {
        self.view.refresh();
        self.load_files();
    }

    /// Read the files the open detail screen shows (its turn's prompt and compile log) that are not
    /// read yet.
    fn load_files(&mut self) {
        let Screen::Detail(d) = &self.screen else {
            return;
        };
        let Some(dir) = self.meta.run_dir.clone() else {
            return;
        };
        let Some(t) = self.view.tasks.get(&d.task) else {
            return;
        };
        let mut wanted = Vec::new();
        if let Some(p) = t.prompt_files.get(&d.turn) {
            wanted.push(p.clone());
        }
        if let Some(p) = t
            .turns()
            .get((d.turn as usize).saturating_sub(1))
            .and_then(|r| r.compile.as_ref())
            .and_then(|c| c.log_path.clone())
        {
            wanted.push(p);
        }
        for rel in wanted {
            if self.files.contains_key(&rel) {
                continue;
            }
            let text = read_capped(&dir.join(&rel));
            self.files.insert(rel, text);
        }
    }

    /// A file [`App::load_files`] read, by the path the log names.
    pub fn file(&self, rel: &str) -> Option<&str> {
        self.files.get(rel).map(String::as_str)
    }
}

/// The value after `current` in `values`, then none again.
fn cycle<T: Copy + PartialEq>(values: &[T], current: Option<T>) -> Option<T> {
    match current {
        None => values.first().copied(),
        Some(c) => {
            let i = values.iter().position(|v| *v == c)?;
            values.get(i + 1).copied()
        }
    }
}

fn read_capped(path: &std::path::Path) -> String {
    match std::fs::read(path) {
        Ok(mut bytes) => {
            let cut = bytes.len() > MAX_FILE_BYTES;
            bytes.truncate(MAX_FILE_BYTES);
            let mut s = String::from_utf8_lossy(&bytes).into_owned();
            if cut {
                s.push_str(&format!(
                    "\n[cut at {} KiB; the whole file is {}]",
                    MAX_FILE_BYTES / 1024,
                    path.display()
                ));
            }
            s
        }
        Err(e) => format!("[cannot read {}: {e}]", path.display()),
    }
}
