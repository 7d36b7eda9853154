/*
 * A stand-in for Fabric Manager's client library, libnvfm.so.1, built by the tests with the system's C compiler.
 *
 * It exports the functions and structure layouts of Fabric Manager's API (nv_fm_agent.h, nv_fm_types.h: field
 * order, array bounds, the version word sizeof(struct) | version << 24, the return codes) and answers by the rules
 * those headers document, so dradriver's ctypes client is exercised against the real ABI rather than against
 * itself. In place of a Fabric Manager daemon it reads a table from the file named by $NVFM_STANDIN_TABLE at
 * every call and writes the activation state back, so the state outlives a connection and a process, as the
 * fabric's does. One item a line:
 *
 *   partition ID ACTIVE PHYSICAL_ID,PCI_BUS_ID,UUID ...   a partition FM supports and its GPUs
 *   tcp ADDRESS:PORT                                       FM listens there too (a unix socket must exist)
 *   not-shared                                             FM is not in shared-NVSwitch mode
 *   refuse ID CODE                                         fmActivateFabricPartition(ID) answers CODE
 *   report-partitions N                                    numPartitions says N (a count past the bound)
 *   report-gpus ID N                                       partition ID's numGpus says N
 *   not-ready N CODE                                       the next N fmGetSupportedFabricPartitions answer CODE
 *                                                          (FM starting: FM_ST_NOT_CONFIGURED, FM_ST_NOT_READY)
 *   fail-shutdown N                                        the next N fmLibShutdown answer FM_ST_GENERIC_ERROR
 *
 * A partition's GPU is PHYSICAL_ID,PCI_BUS_ID,UUID; an empty PCI_BUS_ID (PHYSICAL_ID,,UUID) reports an empty one.
 * Every call is appended to $NVFM_STANDIN_LOG (when set), so a test sees one connection per operation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STR_LENGTH 256
#define UUID_SIZE 80
#define PCI_BUS_ID_SIZE 32
#define MAX_GPUS 16
#define MAX_PARTITIONS 64
#define DEFAULT_PORT 6666
#define STRUCT_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((ver) << 24)))

enum {
    ST_SUCCESS = 0,
    ST_BADPARAM = -1,
    ST_GENERIC_ERROR = -2,
    ST_NOT_SUPPORTED = -3,
    ST_UNINITIALIZED = -4,
    ST_VERSION_MISMATCH = -6,
    ST_IN_USE = -7,
    ST_CONNECTION_NOT_VALID = -9,
};
enum { ADDR_INET = 1, ADDR_UNIX = 2 };

typedef struct {
    unsigned int version;
    char addressInfo[STR_LENGTH];
    unsigned int timeoutMs;
    unsigned int addressIsUnixSocket;
    int addressType;
} connect_params;

typedef struct {
    unsigned int physicalId;
    char uuid[UUID_SIZE];
    char pciBusId[PCI_BUS_ID_SIZE];
    unsigned int numNvLinksAvailable;
    unsigned int maxNumNvLinks;
    unsigned int nvlinkLineRateMBps;
} partition_gpu;

typedef struct {
    unsigned int partitionId;
    unsigned int isActive;
    unsigned int numGpus;
    partition_gpu gpuInfo[MAX_GPUS];
} partition_info;

typedef struct {
    unsigned int version;
    unsigned int numPartitions;
    unsigned int maxNumPartitions;
    partition_info partitionInfo[MAX_PARTITIONS];
} partition_list;

typedef struct {
    partition_info info;
    int refuse;          /* the code activation answers; 0: none */
    int reported_gpus;   /* numGpus to report; -1: the real count */
} partition;

static struct {
    partition parts[MAX_PARTITIONS];
    unsigned int count;
    char tcp[STR_LENGTH];
    int not_shared;
    int reported_partitions;
    int not_ready;      /* how many listings still answer not_ready_code */
    int not_ready_code;
    int fail_shutdown;  /* how many fmLibShutdown still fail */
} table;

static int initialised;
static int handles[8]; /* a handle is the address of an open slot */

static void log_call(const char *format, const char *text, unsigned int number) {
    const char *path = getenv("NVFM_STANDIN_LOG");
    FILE *log = path ? fopen(path, "a") : NULL;
    if (!log) return;
    fprintf(log, format, text, number);
    fputc('\n', log);
    fclose(log);
}

static void parse_partition(char *rest) {
    if (table.count >= MAX_PARTITIONS) return;
    partition *p = &table.parts[table.count++];
    memset(p, 0, sizeof(*p));
    p->reported_gpus = -1;
    char *token = strtok(rest, " \t\n");
    p->info.partitionId = token ? (unsigned int)strtoul(token, NULL, 10) : 0;
    token = strtok(NULL, " \t\n");
    p->info.isActive = token ? (unsigned int)strtoul(token, NULL, 10) : 0;
    while ((token = strtok(NULL, " \t\n")) && p->info.numGpus < MAX_GPUS) {
        partition_gpu *gpu = &p->info.gpuInfo[p->info.numGpus++];
        if (sscanf(token, "%u,%31[^,],%79s", &gpu->physicalId, gpu->pciBusId, gpu->uuid) == 1)
            sscanf(token, "%*u,,%79s", gpu->uuid); /* an empty PCI address */
        gpu->numNvLinksAvailable = gpu->maxNumNvLinks = 18;
        gpu->nvlinkLineRateMBps = 26562;
    }
}

static partition *find(unsigned int id) {
    for (unsigned int i = 0; i < table.count; i++)
        if (table.parts[i].info.partitionId == id) return &table.parts[i];
    return NULL;
}

static void parse_line(char *line) {
    unsigned int id;
    int number;
    if (strncmp(line, "partition ", 10) == 0) {
        parse_partition(line + 10);
    } else if (sscanf(line, "tcp %255s", table.tcp) == 1) {
    } else if (strncmp(line, "not-shared", 10) == 0) {
        table.not_shared = 1;
    } else if (sscanf(line, "refuse %u %d", &id, &number) == 2 && find(id)) {
        find(id)->refuse = number;
    } else if (sscanf(line, "report-partitions %d", &number) == 1) {
        table.reported_partitions = number;
    } else if (sscanf(line, "report-gpus %u %d", &id, &number) == 2 && find(id)) {
        find(id)->reported_gpus = number;
    } else if (sscanf(line, "not-ready %d %d", &table.not_ready, &table.not_ready_code) == 2) {
    } else if (sscanf(line, "fail-shutdown %d", &number) == 1) {
        table.fail_shutdown = number;
    }
}

static int load(void) {
    memset(&table, 0, sizeof(table));
    table.reported_partitions = -1;
    const char *path = getenv("NVFM_STANDIN_TABLE");
    FILE *file = path ? fopen(path, "r") : NULL;
    if (!file) return 0;
    char line[4096];
    while (fgets(line, sizeof(line), file)) parse_line(line);
    fclose(file);
    return 1;
}

/* Only activation states change: the other lines are written back as they were read. */
static void save(void) {
    const char *path = getenv("NVFM_STANDIN_TABLE");
    FILE *file = path ? fopen(path, "w") : NULL;
    if (!file) return;
    for (unsigned int i = 0; i < table.count; i++) {
        partition *p = &table.parts[i];
        fprintf(file, "partition %u %u", p->info.partitionId, p->info.isActive);
        for (unsigned int g = 0; g < p->info.numGpus; g++) {
            partition_gpu *gpu = &p->info.gpuInfo[g];
            fprintf(file, " %u,%s,%s", gpu->physicalId, gpu->pciBusId, gpu->uuid);
        }
        fputc('\n', file);
        if (p->refuse) fprintf(file, "refuse %u %d\n", p->info.partitionId, p->refuse);
        if (p->reported_gpus >= 0) fprintf(file, "report-gpus %u %d\n", p->info.partitionId, p->reported_gpus);
    }
    if (table.tcp[0]) fprintf(file, "tcp %s\n", table.tcp);
    if (table.not_shared) fprintf(file, "not-shared\n");
    if (table.reported_partitions >= 0) fprintf(file, "report-partitions %d\n", table.reported_partitions);
    if (table.not_ready > 0) fprintf(file, "not-ready %d %d\n", table.not_ready, table.not_ready_code);
    if (table.fail_shutdown > 0) fprintf(file, "fail-shutdown %d\n", table.fail_shutdown);
    fclose(file);
}

static int valid(void *handle) {
    int *slot = handle;
    return slot >= handles && slot < handles + 8 && *slot;
}

int fmLibInit(void) {
    log_call("%sfmLibInit", "", 0);
    if (initialised) return ST_IN_USE;
    initialised = 1;
    return ST_SUCCESS;
}

int fmLibShutdown(void) {
    log_call("%sfmLibShutdown", "", 0);
    if (!initialised) return ST_UNINITIALIZED;
    if (load() && table.fail_shutdown > 0) {
        table.fail_shutdown--;
        save();
        return ST_GENERIC_ERROR; /* the library stays initialised */
    }
    initialised = 0;
    memset(handles, 0, sizeof(handles));
    return ST_SUCCESS;
}

static int reachable(const connect_params *params) {
    struct stat info;
    if (params->addressType == ADDR_UNIX)
        return stat(params->addressInfo, &info) == 0 && S_ISSOCK(info.st_mode);
    if (params->addressType != ADDR_INET) return 0;
    char address[STR_LENGTH + 8];
    /* "x.x.x.x" alone means FM's default port. */
    if (strchr(params->addressInfo, ':')) snprintf(address, sizeof(address), "%s", params->addressInfo);
    else snprintf(address, sizeof(address), "%s:%d", params->addressInfo, DEFAULT_PORT);
    return table.tcp[0] && strcmp(address, table.tcp) == 0;
}

int fmConnect(connect_params *params, void **handle) {
    if (!initialised) return ST_UNINITIALIZED;
    if (!params || !handle) return ST_BADPARAM;
    char what[STR_LENGTH + 64];
    snprintf(what, sizeof(what), "unix=%u type=%d address=%s", params->addressIsUnixSocket, params->addressType,
             params->addressInfo);
    log_call("fmConnect %s timeout=%u", what, params->timeoutMs);
    if (params->version != STRUCT_VERSION(connect_params, 2)) return ST_VERSION_MISMATCH;
    if ((params->addressType == ADDR_UNIX) != (params->addressIsUnixSocket == 1)) return ST_BADPARAM;
    load();
    if (!reachable(params)) return ST_CONNECTION_NOT_VALID;
    for (int i = 0; i < 8; i++) {
        if (!handles[i]) {
            handles[i] = 1;
            *handle = &handles[i];
            return ST_SUCCESS;
        }
    }
    return ST_IN_USE;
}

int fmDisconnect(void *handle) {
    log_call("%sfmDisconnect", "", 0);
    if (!initialised) return ST_UNINITIALIZED;
    if (!valid(handle)) return ST_BADPARAM;
    *(int *)handle = 0;
    return ST_SUCCESS;
}

int fmGetSupportedFabricPartitions(void *handle, partition_list *list) {
    log_call("%sfmGetSupportedFabricPartitions", "", 0);
    if (!initialised) return ST_UNINITIALIZED;
    if (!valid(handle) || !list) return ST_BADPARAM;
    if (list->version != STRUCT_VERSION(partition_list, 1)) return ST_VERSION_MISMATCH;
    load();
    if (table.not_shared) return ST_NOT_SUPPORTED;
    if (table.not_ready > 0) {
        table.not_ready--;
        save();
        return table.not_ready_code;
    }
    list->numPartitions = table.reported_partitions >= 0 ? (unsigned int)table.reported_partitions : table.count;
    list->maxNumPartitions = MAX_PARTITIONS;
    for (unsigned int i = 0; i < table.count; i++) {
        list->partitionInfo[i] = table.parts[i].info;
        if (table.parts[i].reported_gpus >= 0) list->partitionInfo[i].numGpus = table.parts[i].reported_gpus;
    }
    return ST_SUCCESS;
}

static int change(void *handle, unsigned int id, int activate) {
    if (!initialised) return ST_UNINITIALIZED;
    if (!valid(handle)) return ST_BADPARAM;
    load();
    if (table.not_shared) return ST_NOT_SUPPORTED;
    partition *p = find(id);
    if (!p) return ST_BADPARAM; /* "unsupported partition id" */
    if (!activate) {
        if (!p->info.isActive) return ST_UNINITIALIZED; /* "specified partition is not activated" */
        p->info.isActive = 0;
        save();
        return ST_SUCCESS;
    }
    if (p->info.isActive) return ST_IN_USE; /* "specified partition is already active" */
    if (p->refuse) return p->refuse;
    for (unsigned int i = 0; i < table.count; i++) {
        partition *other = &table.parts[i];
        if (!other->info.isActive) continue;
        for (unsigned int a = 0; a < other->info.numGpus; a++)
            for (unsigned int b = 0; b < p->info.numGpus; b++)
                /* The stand-in's choice: FM's header names no code for this case (real FM may answer
                 * FM_ST_RESOURCE_USED_IN_ANOTHER_PARTITION, -24). */
                if (other->info.gpuInfo[a].physicalId == p->info.gpuInfo[b].physicalId) return ST_IN_USE;
    }
    p->info.isActive = 1;
    save();
    return ST_SUCCESS;
}

int fmActivateFabricPartition(void *handle, unsigned int id) {
    log_call("%sfmActivateFabricPartition %u", "", id);
    return change(handle, id, 1);
}

int fmDeactivateFabricPartition(void *handle, unsigned int id) {
    log_call("%sfmDeactivateFabricPartition %u", "", id);
    return change(handle, id, 0);
}
